// How a model is laid out over a tensor-parallel mesh axis: the plan the composition
// (app/compose.hpp) hands to a model's tensor-parallel transform (app::Network), as
// torchtitan's parallelize applies a model's TP plan. The layouts themselves are the
// layers' (parallel/tensor_parallel.hpp, tp_async_dense.hpp, tp_transformer_block.hpp).
#pragma once

#include <string>

namespace distjax::parallel {

/// How a model is laid out over the model axis.
enum class TPLayout {
  /// No tensor parallelism: parameters replicated.
  None,
  /// Megatron: activations replicated between blocks (or, sequence parallel, split along
  /// T); qkv and fc1 column-parallel, out and fc2 row-parallel. One all-reduce of
  /// (B, T, C) per attention and per MLP, forward and backward; sequence parallel: an
  /// all-gather and a reduce-scatter of the same bytes instead.
  Megatron,
  /// The toolkit's: activations between blocks are feature-sharded (B, T, C/n); norms take
  /// their statistics over the devices (TPNorm); each projection in gathers its input
  /// (TPDense gather), each projection out reduce-scatters its output (TPDense scatter).
  Gather,
  /// Gather's layout with the gathers and reduce-scatters as ppermute rings whose hops
  /// overlap the matmuls on the chunks already received (TPAsyncDense).
  Async,
};

/// "none", "megatron", "gather", "async".
const char* tp_layout_name(TPLayout layout);
/// The inverse of tp_layout_name; throws ConfigError listing the names otherwise.
TPLayout tp_layout_from_name(const std::string& name);

/// A model's tensor parallelism over one mesh axis. The parameters keep their paths and
/// global shapes in every layout: a scope without a device context runs the single-device
/// model with the same parameters. Which layouts and options a model supports is the
/// model's (a ConfigError names the others).
struct TPPlan {
  TPLayout layout = TPLayout::None;
  std::string axis = "model";
  /// Megatron: norms, dropout and the residual stream split along T between blocks.
  bool sequence_parallel = false;
  /// Megatron: the embedding split over the vocabulary (VocabParallelEmbedding); the
  /// logits stay split over V and the loss is vocab_parallel_cross_entropy. Off: the
  /// embedding and the head are replicated.
  bool vocab_parallel = false;
  /// Async: rings in both directions.
  bool bidirectional = false;
};

/// "megatron + sequence parallel + vocabulary parallel", "async (bidirectional rings)".
std::string describe(const TPPlan& tp);

}  // namespace distjax::parallel
