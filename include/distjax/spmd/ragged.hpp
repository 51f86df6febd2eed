// The ragged all-to-all in two halves (ragged_all_to_all_start / ragged_all_to_all_done):
// the exchange runs while the device computes, differentiable, with an asynchronous
// transpose, as ppermute_start / ppermute_done do for point-to-point. The blocking form is
// spmd::ragged_all_to_all (collectives.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::spmd {

namespace detail {
struct RaggedState;
}

/// A ragged all-to-all in flight: returned by ragged_all_to_all_start, completed by
/// ragged_all_to_all_done. Owns its buffers, so the caller may drop x at once. Move-only.
class RaggedHandle {
 public:
  RaggedHandle() = default;
  explicit RaggedHandle(std::shared_ptr<detail::RaggedState> s) : state_(std::move(s)) {}
  RaggedHandle(RaggedHandle&&) noexcept = default;
  RaggedHandle& operator=(RaggedHandle&&) noexcept = default;
  RaggedHandle(const RaggedHandle&) = delete;
  RaggedHandle& operator=(const RaggedHandle&) = delete;
  bool valid() const { return state_ != nullptr; }

 private:
  friend tensor::Tensor ragged_all_to_all_done(RaggedHandle& handle);
  std::shared_ptr<detail::RaggedState> state_;
};

/// Starts spmd::ragged_all_to_all(ctx, x, axes, send_counts, recv_counts, block) and returns
/// at once: the rows travel while this device computes. Same arguments and checks. Like
/// every collective, the devices of `axes` must start their exchanges (and other
/// collectives over `axes`) in the same order; they may complete them in any order.
///
/// Differentiable as one op from start to done: the backward pass starts the exchange of
/// the cotangent back where it reaches ragged_all_to_all_done and completes it where it
/// reaches ragged_all_to_all_start, so the backward of what was computed between them
/// overlaps it as the forward did.
///
///   RaggedHandle h = ragged_all_to_all_start(ctx, rows, "expert", send, recv, block);
///   Tensor y0 = experts(previous_chunk);     // overlaps the exchange
///   Tensor got = ragged_all_to_all_done(h);
RaggedHandle ragged_all_to_all_start(DeviceContext& ctx, const tensor::Tensor& x,
                                     const Axes& axes,
                                     const std::vector<std::int64_t>& send_counts,
                                     const std::vector<std::int64_t>& recv_counts,
                                     std::int64_t block);

/// Waits for the exchange started by ragged_all_to_all_start and returns the rows received:
/// (sum recv_counts, ...), in device order. Consumes the handle. Throws CommError naming
/// the op and axes when the exchange fails.
tensor::Tensor ragged_all_to_all_done(RaggedHandle& handle);

}  // namespace distjax::spmd
