// Tensor parallelism, synchronous: Megatron's conjugate regions, column- and
// row-parallel Dense, the toolkit's TPDense (gather / scatter), the norm over sharded
// features, and the vocabulary-parallel embedding and cross-entropy.
//
// Shape legend: B batch, T sequence, K input features, F output features, C model width,
// V vocabulary, n = size of the model axis. Each layer takes an nn::Scope: on a scope
// bound to a device (Scope::on(ctx), inside shard_map) parameters are this device's shards
// and the layer runs its collectives over `axis`; on a scope without a context (one
// device) every region is the identity and the layer is the plain single-device layer
// with the same global parameters, which is what the parity tests compare against.
//
// The gradients come out right by construction (spmd/collectives.hpp, varying axes): a
// replicated activation entering a region whose results vary is pvary'd (backward: psum),
// a partial sum leaving it is psum'd (backward: identity). Megatron's block therefore runs
// one all-reduce forward and one backward; its sequence-parallel form an all-gather and a
// reduce-scatter each way instead.
#pragma once

#include <cstdint>
#include <string>

#include "distjax/mesh/mesh.hpp"
#include "distjax/nn/initializers.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/train/strategy.hpp"

namespace distjax::parallel {

using tensor::TensorTree;

using tensor::Tensor;

// ------------------------------------------------------------ regions (Megatron's mappings)
// Each forward sits next to its backward (the transpose). `ctx` null = one device: identity.

/// Enters a tensor-parallel region: identity forward, psum over `axis` backward
/// (Megatron's copy_to_tensor_model_parallel_region, "f"). x: any, replicated along
/// `axis`; result: varies along `axis`. A no-op on an x that already varies.
Tensor copy_to_tp_region(spmd::DeviceContext* ctx, const Tensor& x, const mesh::Axes& axis);
/// Leaves it: psum over `axis` forward, identity backward (Megatron's "g"). x: partial
/// sums, varying; result: replicated along `axis`.
Tensor reduce_from_tp_region(spmd::DeviceContext* ctx, const Tensor& x, const mesh::Axes& axis);
/// Sequence parallelism, entering: all_gather along `dim` (tiled) forward, reduce-scatter
/// backward. x (B, T/n, C) -> (B, T, C), varying.
Tensor gather_from_sp_region(spmd::DeviceContext* ctx, const Tensor& x, const mesh::Axes& axis,
                             int dim = 1);
/// Sequence parallelism, leaving: reduce-scatter along `dim` forward, all-gather backward.
/// x (B, T, C) partial sums -> (B, T/n, C), this device's block of the sum.
Tensor reduce_scatter_to_sp_region(spmd::DeviceContext* ctx, const Tensor& x,
                                   const mesh::Axes& axis, int dim = 1);
/// This device's block of a replicated x along `dim` (no communication forward; backward,
/// the blocks' cotangents are assembled with a psum). x (.., n*S, ..) -> (.., S, ..),
/// varying. Throws ShardingError when the dimension is not divisible by n.
Tensor split_to_sp_region(spmd::DeviceContext* ctx, const Tensor& x, const mesh::Axes& axis,
                          int dim = 1);

// ------------------------------------------------------------ Megatron layers

/// Column-parallel Dense: x (..., K) replicated along `axis` -> (..., F/n), varying.
/// Parameters: "kernel" (K, F) split P(None, axis), "bias" (F) split P(axis). Enters the
/// region with copy_to_tp_region (one psum of dx backward); no communication forward.
/// With an x that already varies (sequence parallelism gathers it first) nothing is added.
struct ColumnParallelDense {
  std::int64_t features = 0;  ///< F, global
  std::string axis = "model";
  bool use_bias = true;
  nn::Initializer kernel_init = nn::lecun_normal();
  nn::Initializer bias_init = nn::zeros();
  /// The local product's epilogue, as nn::Dense's: GELU (tanh), the compute dtype out.
  bool gelu = false;
  bool compute_dtype_output = false;

  Tensor operator()(const nn::Scope& scope, const Tensor& x) const;
};

/// Row-parallel Dense: x (..., K/n), varying -> (..., F), the partial products summed
/// over `axis` (psum: replicated), bias added once after the sum. With
/// `sequence_parallel`, the sum is a reduce-scatter along dimension 1 instead: (B, T, K/n)
/// -> (B, T/n, F). Parameters: "kernel" (K, F) split P(axis, None), "bias" (F) replicated.
struct RowParallelDense {
  std::int64_t features = 0;  ///< F, global
  std::string axis = "model";
  bool use_bias = true;
  bool sequence_parallel = false;
  nn::Initializer kernel_init = nn::lecun_normal();
  nn::Initializer bias_init = nn::zeros();

  Tensor operator()(const nn::Scope& scope, const Tensor& x) const;
};

// ------------------------------------------------------------ the toolkit's TPDense

/// Where a TPDense communicates (the toolkit's tp_mode).
enum class TPMode {
  /// all_gather the feature-sharded input, then the local product: (..., K/n) -> (..., F/n).
  Gather,
  /// the local product to full width, then psum_scatter over features: (..., K/n) -> (..., F/n).
  Scatter,
  /// a plain Dense (also what an axis of size 1 runs).
  None,
};

/// The toolkit's tensor-parallel Dense: activations stay feature-sharded between layers
/// (gather before, reduce-scatter after).
///  - Gather: "kernel" (K, F) split P(None, axis), "bias" (F) split P(axis); x (..., K/n)
///    is all-gathered over the last dimension; skip_communication: x is already (..., K).
///  - Scatter: "kernel" (K, F) split P(axis, None), "bias" (F) split P(axis); the partial
///    (..., F) is psum_scatter'ed over features and the bias added to this device's block;
///    skip_communication: returns the partial sums (..., F) and adds NO bias: the caller
///    reduces them (psum) and adds one bias once.
///  - None: a plain Dense (..., K) -> (..., F), parameters replicated.
/// `kernel_init_adjustment` scales the kernel's initialiser (the toolkit's
/// tp^-0.5 for the layers of an MLP block).
struct TPDense {
  std::int64_t features = 0;  ///< F, global
  std::string axis = "model";
  TPMode mode = TPMode::Gather;
  bool skip_communication = false;
  bool use_bias = true;
  nn::Initializer kernel_init = nn::lecun_normal();
  nn::Initializer bias_init = nn::zeros();
  double kernel_init_adjustment = 1.0;

  Tensor operator()(const nn::Scope& scope, const Tensor& x) const;
};

/// Norm over features sharded along `axis` (the toolkit's TPNorm): the statistics are
/// summed over the devices (psum), so the result equals the norm of the whole vector.
/// x (..., C/n) -> (..., C/n). RMS: y = x / sqrt(mean(x^2) + eps) * scale. Layer: also
/// subtracts the mean and adds "bias". Parameters "scale" (C) [, "bias" (C)] split P(axis).
struct TPNorm {
  enum class Kind { RMS, Layer };
  Kind kind = Kind::RMS;
  float eps = 1e-6f;
  std::string axis = "model";

  Tensor operator()(const nn::Scope& scope, const Tensor& x) const;
};

// ------------------------------------------------------------ vocabulary parallelism

/// Embedding whose table is split over the vocabulary: "embedding" (V, C) split
/// P(axis, None); device i holds rows [i V/n, (i+1) V/n).
///  - operator(): ids (B, T) replicated -> (B, T, C): each device looks up the ids in its
///    range (zeros elsewhere) and the rows are summed over `axis` (psum, replicated); with
///    `sequence_parallel` the sum is a reduce-scatter along T, giving (B, T/n, C).
///  - attend: the tied output projection, x (..., C) -> logits (..., V/n), this device's
///    vocabulary block, never gathered (vocab_parallel_cross_entropy consumes it).
struct VocabParallelEmbedding {
  std::int64_t num_embeddings = 0;  ///< V, global
  std::int64_t features = 0;        ///< C
  std::string axis = "model";
  nn::Initializer embedding_init = nn::normal(0.02);

  Tensor operator()(const nn::Scope& scope, const Tensor& ids,
                    bool sequence_parallel = false) const;
  Tensor attend(const nn::Scope& scope, const Tensor& x) const;
};

/// Cross-entropy over logits whose vocabulary is split over `axis` (Megatron's
/// vocab-parallel cross-entropy): logits (N..., V/n), this device's block of the
/// vocabulary; labels (N...) i32/i64 global ids, replicated. Returns the per-example loss
/// (N...), replicated: log(sum_v exp(l_v)) - l_label, with the max, the sum of
/// exponentials and the label's logit each reduced over `axis` (pmax, psum, psum of
/// (N...) values); the logits are never gathered. `ctx` null = one device (the plain
/// cross-entropy). Labels outside [0, V) are an InvalidArgument.
Tensor vocab_parallel_cross_entropy(spmd::DeviceContext* ctx, const Tensor& logits,
                                    const Tensor& labels, const mesh::Axes& axis);

// ------------------------------------------------------------ the strategy

/// The Strategy of tensor parallelism alone (a mesh without a data axis). The tape already
/// gives each device the gradients of its shards and, summed over the devices that used
/// them, of the replicated parameters; what needs the mesh is the global gradient norm
/// (clipping, the "grad_norm" metric): sharded leaves are summed over their shards
/// (global_norm_squared). With a data axis too, use DataParallel, which does the same.
///
///   parallel::TensorParallel tp(ctx, "model");
///   train::train_step(state, batch, loss_fn, opt, {.max_grad_norm = 1.0, .strategy = &tp});
class TensorParallel final : public train::Strategy {
 public:
  explicit TensorParallel(spmd::DeviceContext& ctx, mesh::Axes axes = "model");
  double grad_norm_squared(const TensorTree& grads) override;

 private:
  spmd::DeviceContext* ctx_;
  mesh::Axes axes_;
};

}  // namespace distjax::parallel
