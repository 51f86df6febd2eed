// ppermute: point-to-point along a mesh axis, synchronous and asynchronous
// (ppermute_start / ppermute_done), differentiable, with an asynchronous transpose.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::spmd {

namespace detail {
struct PermuteState;
}

/// A ppermute in flight: returned by ppermute_start, completed by ppermute_done. Owns its
/// send and receive buffers, so the caller may drop x at once. Move-only.
class PermuteHandle {
 public:
  PermuteHandle() = default;
  explicit PermuteHandle(std::shared_ptr<detail::PermuteState> s) : state_(std::move(s)) {}
  PermuteHandle(PermuteHandle&&) noexcept = default;
  PermuteHandle& operator=(PermuteHandle&&) noexcept = default;
  PermuteHandle(const PermuteHandle&) = delete;
  PermuteHandle& operator=(const PermuteHandle&) = delete;
  bool valid() const { return state_ != nullptr; }
  const std::shared_ptr<detail::PermuteState>& state() const { return state_; }

 private:
  std::shared_ptr<detail::PermuteState> state_;
};

/// Starts sending x along `axes` according to `perm`, a list of (source, destination)
/// pairs of axis indices (each index at most once as source and once as destination),
/// and returns at once: the transfer runs while this device computes. Only the two
/// devices of each pair take part (no rendezvous of the whole group). x is made to vary
/// along `axes` (pvary); the result will too.
///
/// Differentiable as one op from start to done: its transpose is the same transfer with
/// every pair reversed, and it is asynchronous too: the backward pass starts the reverse
/// send where it reaches ppermute_done and completes it where it reaches ppermute_start,
/// so the backward of the compute between them overlaps the transfer as the forward did.
///
///   PermuteHandle h = ppermute_start(ctx, chunk, "model", ring_permutation(n));
///   Tensor partial = matmul(x, w);            // overlaps the transfer
///   Tensor next = ppermute_done(h);           // the left neighbour's chunk
PermuteHandle ppermute_start(DeviceContext& ctx, const tensor::Tensor& x, const Axes& axes,
                             const std::vector<std::pair<int, int>>& perm);

/// Waits for the transfer started by ppermute_start and returns what this device
/// received (zeros of x's shape when no pair sends to it). Consumes the handle.
/// Throws CommError naming the op and the peer on timeout or a size mismatch.
tensor::Tensor ppermute_done(PermuteHandle& handle);

/// ppermute_done(ppermute_start(...)): devices that receive nothing get zeros. Shape and
/// dtype are unchanged. Transpose: ppermute with the inverse permutation.
tensor::Tensor ppermute(DeviceContext& ctx, const tensor::Tensor& x, const Axes& axes,
                        const std::vector<std::pair<int, int>>& perm);

/// The ring shift used by collective matmuls and pipelines: device i sends to
/// (i + shift) mod n along `axes`.
std::vector<std::pair<int, int>> ring_permutation(int n, int shift = 1);

}  // namespace distjax::spmd
