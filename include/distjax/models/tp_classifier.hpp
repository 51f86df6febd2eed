// TPClassifier: the toolkit's tensor-parallel MLP classifier. Activations between layers
// are feature-sharded over the model axis (TPDense gather before, scatter after).
// Shape legend: B batch, F input features, D hidden width, K classes, n = model axis size.
#pragma once

#include <cstdint>
#include <string>

#include "distjax/core/prng.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::models {

using tensor::Tensor;
using tensor::TensorTree;

struct TPClassifierConfig {
  std::int64_t in_features = 784;  // F
  std::int64_t hidden = 512;       // D, divisible by n
  std::int64_t num_classes = 10;   // K
  int num_layers = 3;              // TP MLP blocks
  std::int64_t mlp_expansion = 1;  // block hidden width = D * mlp_expansion
  float dropout = 0.1f;            // after the block's activation (masks equal one device's)
  std::string axis = "model";
  /// Scales the blocks' kernel initialisers (the toolkit used n^-0.5, which makes the
  /// model depend on the mesh; 1 keeps one model for every mesh).
  double kernel_init_adjustment = 1.0;
  /// The toolkit's TPAsyncMLPBlock: each block's gather and reduce-scatter run as ppermute
  /// rings overlapped with the matmuls (parallel::TPAsyncDense), its norm on the sharded
  /// features (parallel::TPNorm). The same model and parameters (the norm's scale is then
  /// stored split over the axis).
  bool async_rings = false;
  /// With async_rings: rings in both directions.
  bool bidirectional = false;
};

/// x (B, F) replicated along the model axis -> logits (B, K) replicated:
///   h = input: TPDense(gather, skip_communication) x          (B, D/n)
///   layers/i: h = h + fc2(dropout(silu(fc1(rms_norm(all_gather(h))))))
///             fc1 TPDense(gather, skip_communication) D -> D*e, fc2 TPDense(scatter) -> D
///             (async_rings: h + fc2(dropout(silu(fc1(tp_rms_norm(h))))) with TPAsyncDense
///             gather and scatter rings)
///   logits = psum(output: TPDense(scatter, skip_communication, no bias) h) + output/bias
/// The output bias is added once, after the sum (the toolkit added it n times).
/// Parameters: "input/{kernel (F, D), bias (D)}", "layers/<i>/norm/scale (D)",
/// "layers/<i>/fc1/{kernel (D, D e), bias}", "layers/<i>/fc2/{kernel (D e, D), bias (D)}",
/// "output/kernel (D, K)", "output/bias (K)". On a scope bound to a device the kernels and
/// the sharded biases are this device's shards; on one device, the whole model.
///
///   models::TPClassifier model(cfg);
///   TensorTree params = model.init(Key::from_seed(0), &specs, &ctx);   // inside shard_map
///   Tensor logits = model(nn::Scope::apply(&params, true, key).on(ctx), x);
class TPClassifier {
 public:
  explicit TPClassifier(TPClassifierConfig config = {});

  /// Parameters (this device's shards with a context; the whole model without); records
  /// the PartitionSpec of every sharded parameter into `*specs` when given.
  TensorTree init(Key key, nn::ParamSpecs* specs = nullptr,
                  spmd::DeviceContext* ctx = nullptr) const;
  Tensor operator()(const nn::Scope& scope, const Tensor& x) const;

  /// Number of parameters (global).
  std::int64_t num_params() const;
  const TPClassifierConfig& config() const { return config_; }

 private:
  TPClassifierConfig config_;
};

}  // namespace distjax::models
