// Data parallelism: the model is replicated over the data axes, each device trains on
// its slice of the batch, and gradients are averaged over the data axes.
#pragma once

#include <cstddef>

#include "distjax/mesh/mesh.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::parallel {

using tensor::TensorTree;

/// Default bucket size of sync_grads: leaves are packed into buckets of at most this
/// many bytes, one all_reduce per bucket (fewer, larger messages than one per leaf).
constexpr std::size_t kDefaultBucketBytes = std::size_t{32} << 20;

/// The mean of every f32 leaf of `grads` over the devices along `axes` (pmean), as a new
/// tree with the same paths. Leaves are packed in path order into buckets of at most
/// `bucket_bytes` and each bucket is averaged with one all_reduce over ctx.comm(axes);
/// the result's leaves are views into the buckets. Every device along `axes` must pass
/// a tree with the same paths and shapes (a mismatch is a CommError naming the devices).
/// Runs outside the tape: call it after the backward pass. Collectives: all_reduce
/// (mean) over `axes`, once per bucket.
///
///   TensorTree g = autodiff::grad(loss_fn)(params, local_batch);
///   g = parallel::sync_grads(ctx, g, "data");   // now equal on every data replica
TensorTree sync_grads(spmd::DeviceContext& ctx, const TensorTree& grads, const mesh::Axes& axes,
                      std::size_t bucket_bytes = kDefaultBucketBytes);

}  // namespace distjax::parallel
