// ResidualClassifier: an MLP classifier of residual blocks (the toolkit's TP classifier),
// on one device or laid out over a model axis by the composition: "gather" (activations
// between blocks feature-sharded, TPDense gather before and scatter after) or "async" (the
// same with ppermute rings overlapped with the matmuls).
// Shape legend: B batch, F input features, D hidden width, K classes, n = model axis size.
#pragma once

#include <cstdint>
#include <string>

#include "distjax/core/prng.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/parallel/tp_layout.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::models {

using tensor::Tensor;
using tensor::TensorTree;

struct ResidualClassifierConfig {
  std::int64_t in_features = 784;  // F
  std::int64_t hidden = 512;       // D, divisible by n
  std::int64_t num_classes = 10;   // K
  int num_layers = 3;              // residual MLP blocks
  std::int64_t mlp_expansion = 1;  // block hidden width = D * mlp_expansion
  float dropout = 0.1f;            // after the block's activation (masks equal one device's)
  /// Scales the blocks' kernel initialisers (the toolkit used n^-0.5, which makes the
  /// model depend on the mesh; 1 keeps one model for every mesh).
  double kernel_init_adjustment = 1.0;
  /// The layout over tp.axis: none (one device's layers), gather or async (the toolkit's
  /// TPAsyncMLPBlock: each block's gather and reduce-scatter as ppermute rings overlapped
  /// with the matmuls, its norm on the sharded features; tp.bidirectional: rings both
  /// ways). Megatron, sequence and vocabulary parallelism are the Transformer's: a
  /// ConfigError here. Every layout is the same model with the same parameters.
  parallel::TPPlan tp{};
};

/// x (B, F) replicated along the model axis -> logits (B, K) replicated:
///   h = input: Dense(D) x                                      gather: (B, D/n)
///   layers/i: h = h + fc2(dropout(silu(fc1(rms_norm(h)))))     fc1 D -> D*e, fc2 -> D
///             gather: the norm on all_gather(h), fc1 TPDense(gather, skip_communication),
///             fc2 TPDense(scatter); async: TPNorm on h, TPAsyncDense gather and scatter
///   logits = output: Dense(K) h      gather/async: psum of the partial products, one bias
/// Parameters: "input/{kernel (F, D), bias (D)}", "layers/<i>/norm/scale (D)",
/// "layers/<i>/fc1/{kernel (D, D e), bias}", "layers/<i>/fc2/{kernel (D e, D), bias (D)}",
/// "output/kernel (D, K)", "output/bias (K)". On a scope bound to a device, in a layout
/// other than none, the kernels and the sharded biases are this device's shards.
///
///   models::ResidualClassifier model(cfg);                     // one device
///   TensorTree params = model.init(Key::from_seed(0));
///   cfg.tp.layout = parallel::TPLayout::Gather;                 // inside shard_map
///   TensorTree shards = models::ResidualClassifier(cfg).init(Key::from_seed(0), &specs, &ctx);
class ResidualClassifier {
 public:
  explicit ResidualClassifier(ResidualClassifierConfig config = {});

  /// Parameters (this device's shards with a context; the whole model without); records
  /// the PartitionSpec of every sharded parameter into `*specs` when given; stored fully
  /// sharded as `fsdp` says when given.
  TensorTree init(Key key, nn::ParamSpecs* specs = nullptr, spmd::DeviceContext* ctx = nullptr,
                  const nn::FullySharded* fsdp = nullptr) const;
  Tensor operator()(const nn::Scope& scope, const Tensor& x) const;

  /// Number of parameters (global).
  std::int64_t num_params() const;
  const ResidualClassifierConfig& config() const { return config_; }

 private:
  Tensor block(const nn::Scope& scope, const Tensor& h) const;
  ResidualClassifierConfig config_;
};

}  // namespace distjax::models
