// The tensor-parallel attention and MLP of a transformer block, in each layout: the
// projections into and out of the model-parallel region (TPProjections), TP multi-head
// attention with heads sharded, and the TP MLP block (the toolkit's TPMLPBlock, and
// TPAsyncMLPBlock with layout Async).
// Shape legend: B batch, T sequence, C model width, H heads, n = size of the model axis.
#pragma once

#include <cstdint>
#include <string>

#include "distjax/nn/initializers.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/parallel/context_parallel.hpp"
#include "distjax/parallel/tp_layout.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::parallel {

using tensor::Tensor;

/// What a TP input projection's product does before writing (nn::Dense's fields of the
/// same names): for the layouts whose projection is one local product (None, Megatron).
struct TPEpilogue {
  bool gelu = false;
  bool compute_dtype_output = false;
};

/// How activations enter and leave the model-parallel region in a layout:
///  - Megatron: in = ColumnParallelDense (sequence parallel: after an all-gather along T),
///    out = RowParallelDense (psum, or reduce-scatter along T); x (B, T, C) or (B, T/n, C).
///  - Gather: in = TPDense gather, out = TPDense scatter; x (B, T, C/n).
///  - Async: the same with TPAsyncDense rings (bidirectional: both ways).
///  - None: plain Dense both ways.
/// Parameters of each projection: "kernel" (K, F), "bias" (F), at the scope given.
struct TPProjections {
  std::string axis = "model";
  TPLayout layout = TPLayout::Megatron;
  bool sequence_parallel = false;
  bool bidirectional = false;

  /// x -> (B, T, F/n): the input projection (whole x gathered as the layout does it).
  /// A non-default `epilogue` needs a local() layout (else InvalidArgument).
  Tensor in(const nn::Scope& scope, const Tensor& x, std::int64_t features,
            const nn::Initializer& init, const TPEpilogue& epilogue = {}) const;
  /// x (B, T, K/n) -> the residual stream's layout, F features.
  Tensor out(const nn::Scope& scope, const Tensor& x, std::int64_t features,
             const nn::Initializer& init) const;
  /// The global width C of an activation x in this layout on this scope's mesh.
  std::int64_t width(const nn::Scope& scope, const Tensor& x) const;
  /// Whether the projections multiply locally, the feature-sharded activation between
  /// them never moving (None, Megatron): then it may come in the compute dtype.
  bool local() const { return layout == TPLayout::None || layout == TPLayout::Megatron; }
};

/// Multi-head attention (causal by default) with its heads split over the axis: fused qkv
/// projection in ("qkv", columns laid out (H, 3, D) so each device holds whole heads),
/// attention on this device's H/n heads, output projection out ("out"). As
/// nn::MultiHeadAttention on one device. num_heads must be divisible by n.
struct TPMultiHeadAttention {
  std::int64_t num_heads = 1;
  /// Each position attends to earlier ones only; false: to every position (an encoder).
  bool causal = true;
  TPProjections proj{};
  nn::Initializer kernel_init = nn::lecun_normal();
  nn::Initializer out_init = nn::lecun_normal();
  /// Document ids i32 (B, T) (whole T, also under sequence parallelism), or undefined:
  /// attention within each document (tensor::attention's `segments`).
  Tensor segments = Tensor();
  /// Context parallelism (active: x holds this device's positions of the sequence): the
  /// attention crosses the split as context.method says (no document ids).
  ContextPlan context{};

  Tensor operator()(const nn::Scope& scope, const Tensor& x) const;
};

/// The MLP of a block: "fc1" in (hidden), GELU (tanh), "fc2" out (C); no norm, no
/// residual. As nn::MLPBlock on one device. With proj.layout Async it is the toolkit's
/// TPAsyncMLPBlock (its matmuls overlapping the ring hops).
struct TPMLPBlock {
  /// Hidden width; 0 means 4 * C.
  std::int64_t hidden = 0;
  TPProjections proj{};
  nn::Initializer kernel_init = nn::lecun_normal();
  nn::Initializer out_init = nn::lecun_normal();

  Tensor operator()(const nn::Scope& scope, const Tensor& x) const;
};

}  // namespace distjax::parallel
