// Global-norm gradient clipping (optax.clip_by_global_norm). Across shards, the
// squared norms of the local shards are summed over the mesh before the square root.
#pragma once

#include "distjax/tensor/tensor_tree.hpp"
#include "distjax/tensor/update_ops.hpp"

namespace distjax::optim {

/// Sum of squares of every floating leaf, accumulated in double.
double global_norm_squared(const tensor::TensorTree& tree);
/// sqrt(global_norm_squared(tree)).
double global_norm(const tensor::TensorTree& tree);

/// Scales every floating leaf of `grads` in place by max_norm / norm when the global
/// norm exceeds `max_norm` (> 0); returns the norm before clipping.
double clip_by_global_norm(tensor::TensorTree& grads, double max_norm);

/// Scales every floating leaf of `grads` in place by `factor` (f32 leaves).
void scale_in_place(tensor::TensorTree& grads, double factor);

/// The global norm of every floating leaf (f32, one device) and its clip factor, left on
/// that device: tensor::norm_and_clip_factor over the leaves in tree order (the same bits
/// as global_norm, and as max_norm / norm rounded to f32). No host wait: a step that clips
/// queues it and scale_in_place(grads, factor) and goes on.
tensor::NormAndClipFactor norm_and_clip_factor(const tensor::TensorTree& grads, double max_norm);
/// Scales every floating leaf of `grads` in place by `factor`, one f32 element on their
/// device (f32 leaves).
void scale_in_place(tensor::TensorTree& grads, const tensor::Tensor& factor);

}  // namespace distjax::optim
