// Ring collectives for asynchronous tensor parallelism: all-gather and reduce-scatter done
// as a ring of ppermute_start / ppermute_done hops, so the matmul on one chunk overlaps the
// transfer of the next (the collective matmuls of Wang et al. 2023, JAX's ppermute rings).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "distjax/spmd/device_context.hpp"
#include "distjax/spmd/ppermute.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::parallel {

using tensor::Tensor;

// Notation: n = axis_size(axis), d = axis_index(axis), indices mod n. Every function here
// runs inside shard_map, is called by every device of the group in the same order, and is
// differentiable: it is made of ppermute_start / ppermute_done and tensor ops, so the
// tape runs the transposed ring (gather <-> scatter) asynchronously in the backward pass.
// Results vary over `axis` (a replicated input is pvary'd first, like all_gather). An axis
// of size 1 moves no bytes.

/// Which way(s) the ring runs.
enum class RingMode : std::uint8_t {
  Unidirectional,  // device d receives from d - 1 (gather) / sends to d - 1 (scatter)
  Bidirectional,   // both neighbours at once: about half the hops or half the bytes per hop
};

/// One gathered piece: `value` is the x of the device whose index along the axis is
/// `source` (so it multiplies row block `source` of a weight sharded that way).
struct RingChunk {
  Tensor value;
  int source = 0;
};

/// The sources of the chunks of a ring gather, in the order they arrive on device `index`
/// of `n` (pure; no devices). Unidirectional: d, d-1, ..., d-(n-1). Bidirectional:
/// d, d-1, d+1, d-2, d+2, ... (n entries, each index once).
std::vector<int> ring_gather_sources(int index, int n, RingMode mode);

/// Streaming ring all-gather: next() returns the chunks in ring_gather_sources order, and
/// before returning one it starts the hop that brings the following one, so whatever the
/// caller does with a chunk overlaps the next transfer. Unidirectional: n-1 hops, one in
/// flight at a time; Bidirectional: two rings (from d-1 and from d+1), ceil((n-1)/2) hops,
/// one in flight per direction. Every chunk has x's shape and dtype and varies over `axis`.
/// Collective: each device must take all n chunks (a device that stops early leaves its
/// neighbours waiting; the destructor completes a hop in flight but starts no other).
/// Backward: the transposed ring (each chunk's cotangent travels back to its source and
/// is summed there), its hops overlapping the backward of the per-chunk compute.
///
///   // Column-parallel collective matmul: x (T/n, C) sharded on "model", w (C, F/n).
///   RingGather ring(ctx, x, "model");
///   std::vector<Tensor> rows(n);
///   while (ring.has_next()) {
///     RingChunk c = ring.next();                  // starts the next hop
///     rows[c.source] = tensor::matmul(c.value, w);  // overlaps it
///   }
///   Tensor y = tensor::concat(rows, 0);           // (T, F/n)
class RingGather {
 public:
  RingGather(spmd::DeviceContext& ctx, const Tensor& x, const mesh::Axes& axis,
             RingMode mode = RingMode::Unidirectional);
  RingGather(RingGather&&) noexcept = default;
  RingGather& operator=(RingGather&&) = delete;
  ~RingGather();

  /// Number of devices along the axis (= chunks in all).
  int size() const { return n_; }
  bool has_next() const { return taken_ < n_; }
  /// The next chunk; throws InvalidArgument after the n-th.
  RingChunk next();

 private:
  // One direction of the ring: sends to d + shift, receives from d - shift.
  struct Direction {
    int shift = 1;
    int hops = 0;       // hops this direction makes in all
    int hops_done = 0;  // completed
    spmd::PermuteHandle in_flight;
  };
  RingChunk advance(Direction& dir);

  spmd::DeviceContext* ctx_;
  mesh::Axes axis_;
  int n_ = 1;
  int index_ = 0;
  int taken_ = 0;
  Tensor own_;
  Direction up_;    // from d - 1
  Direction down_;  // from d + 1 (Bidirectional only)
};

/// Ring all-gather of x along `axis`: [x_d, x_{d-1}, ..., x_{d-(n-1)}] (n tensors of x's
/// shape), in n-1 hops. Same values as the blocks of spmd::all_gather, reordered.
/// Transpose: the ring reduce-scatter of the cotangents.
std::vector<Tensor> async_gather(spmd::DeviceContext& ctx, const Tensor& x, const mesh::Axes& axis);

/// Ring all-gather in both directions at once, ceil((n-1)/2) hops: the chunks of
/// ring_gather_sources(d, n, Bidirectional), i.e. [x_d, x_{d-1}, x_{d+1}, x_{d-2}, ...].
std::vector<Tensor> async_gather_bidirectional(spmd::DeviceContext& ctx, const Tensor& x,
                                               const mesh::Axes& axis);

/// Calls fn(chunk, source) on each gathered chunk in ring_gather_sources order, each call
/// overlapping the next hop (RingGather in a loop).
void async_gather_apply(spmd::DeviceContext& ctx, const Tensor& x, const mesh::Axes& axis,
                        const std::function<void(const Tensor& chunk, int source)>& fn,
                        RingMode mode = RingMode::Unidirectional);

/// Ring reduce-scatter. partials[j] is this device's contribution to the block owned by
/// device j (n tensors, one shape and dtype); the result on device d is the sum over
/// devices e of partials_e[d] (that shape; varies over `axis`): the same values as
/// spmd::psum_scatter of concat(partials, 0) (tiled), summed in ring order, so equal up to
/// rounding. n-1 hops: device d starts with its partial for block d+1, sends to d-1, and
/// adds its partial for block d+k+1 to what arrives at hop k, ending with block d.
/// Transpose: the ring all-gather of the cotangent.
Tensor async_scatter(spmd::DeviceContext& ctx, const std::vector<Tensor>& partials,
                     const mesh::Axes& axis);

/// async_scatter with each partial split in two halves along its last dimension (sizes
/// floor(c/2) and the rest; c >= 2): the first half goes round towards d-1, the second
/// towards d+1, at the same time. Same hops, half the bytes each; same result.
Tensor async_scatter_bidirectional(spmd::DeviceContext& ctx, const std::vector<Tensor>& partials,
                                   const mesh::Axes& axis);

/// async_scatter (or its Bidirectional form) whose partials are computed on demand:
/// partial(j) is called once for each block j, just before the ring needs it, so the
/// matmul that makes it overlaps the hop in flight.
/// Unidirectional order: d+1, d+2, ..., d-1, d. Bidirectional: blocks in the order
/// either direction first needs them (d+1, d-1, d+2, d-2, ..., d); the half the other
/// direction needs later is kept until then (so the later hops have nothing to overlap).
///
///   // Row-parallel collective matmul: x (T, C/n) sharded on "model", w (C/n, F);
///   // y (T/n, F) = row block d of the sum over devices of x @ w.
///   Tensor y = async_scatter(ctx, [&](int j) {
///     return tensor::matmul(tensor::slice(x, 0, j * Tn, (j + 1) * Tn), w);
///   }, "model");
Tensor async_scatter(spmd::DeviceContext& ctx, const std::function<Tensor(int block)>& partial,
                     const mesh::Axes& axis, RingMode mode = RingMode::Unidirectional);

}  // namespace distjax::parallel
