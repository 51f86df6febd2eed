// Named-axis collectives on Tensors inside shard_map, each differentiable: forward and
// transpose are written together (DESIGN.md, "Collectives and their transposes").
//
// Gradient convention (the one Megatron and JAX's shard_map use). The cotangent a
// device holds is its share of the gradient of the global objective. Two cases:
//  - a value that VARIES across the devices of `axes` (a shard, a per-device batch
//    result): the global objective is the SUM over devices of what each device
//    computes from it, so transposes of ops producing varying values sum (psum_scatter
//    for all_gather, psum for pvary);
//  - a value that is REPLICATED (equal) along `axes` (the result of psum/pmean/pmax)
//    is one value held in n copies; the code after it is the same on every device and
//    the objective counts it once, so its cotangent is already equal along `axes` and
//    transposes take it as is (identity for psum).
// To move from a replicated value back into per-device varying code whose results are
// summed (e.g. a Megatron column-parallel layer after a replicated input), call pvary.
//
// `axes` is one mesh axis or a set of axes (one group over their product, ranked
// row-major in the order given). Every collective must be called by all devices of the
// group in the same order; otherwise every device fails with CommError naming the op
// and the devices (no hang). Shape legend: n = axis_size(axes).
#pragma once

#include <utility>
#include <vector>

#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::spmd {

using tensor::Tensor;

/// All-reduce sum over `axes`: every device gets the sum of x over its group (same shape,
/// any dtype; sums in fixed rank order on threads).
/// Transpose: identity; assumes the cotangent is equal along `axes` (the result is
/// replicated and used identically on every device).
Tensor psum(DeviceContext& ctx, const Tensor& x, const Axes& axes);

/// psum / n. Transpose: cotangent / n (same assumption as psum).
Tensor pmean(DeviceContext& ctx, const Tensor& x, const Axes& axes);

/// Elementwise max over `axes` (f32). Transpose: each element's cotangent goes to the
/// device of lowest axis_index holding the maximum (the others get zero), like
/// tensor::max over a stacked device dimension; assumes the cotangent is equal along
/// `axes`. (JAX defines no transpose for pmax; this is the subgradient of the
/// single-device max.)
Tensor pmax(DeviceContext& ctx, const Tensor& x, const Axes& axes);

/// Gathers x from every device of `axes` along `dim`: tiled, the pieces are concatenated
/// (x (.., S, ..) -> (.., n*S, ..)); not tiled, they are stacked in a new dimension at
/// `dim` (-> (.., n, S, ..)). Device i's piece is block i.
/// Transpose: psum_scatter of the cotangent along `dim` (same tiling); assumes each
/// device's cotangent is its own contribution (the result feeds per-device code whose
/// results are summed, e.g. FSDP: gathered weights times a per-device batch).
Tensor all_gather(DeviceContext& ctx, const Tensor& x, const Axes& axes, int dim = 0,
                  bool tiled = false);

/// Reduce-scatter: sums x over `axes` and keeps block axis_index(axes) of the result
/// along `dim`: tiled, x (.., n*S, ..) -> (.., S, ..); not tiled, x (.., n, ..) -> the
/// dimension is removed.
/// Transpose: all_gather of the cotangent along `dim` (same tiling); assumes the
/// cotangent of each block varies per device (block i's cotangent lives on device i).
Tensor psum_scatter(DeviceContext& ctx, const Tensor& x, const Axes& axes, int dim = 0,
                    bool tiled = false);

/// Sends x along `axes` according to `perm`, a list of (source, destination) pairs of
/// axis indices; each index appears at most once as source and once as destination.
/// Devices that receive nothing get zeros. Shape and dtype are unchanged.
/// Transpose: ppermute of the cotangent with the inverse permutation (pairs swapped);
/// no assumption on the cotangent (the adjoint of a permutation is its inverse).
Tensor ppermute(DeviceContext& ctx, const Tensor& x, const Axes& axes,
                const std::vector<std::pair<int, int>>& perm);

/// The ring shift used by collective matmuls and pipelines: device i sends to
/// (i + shift) mod n along `axes`.
std::vector<std::pair<int, int>> ring_permutation(int n, int shift = 1);

/// All-to-all (tiled): x is split into n chunks along `split_dim`; chunk j goes to device
/// j; the chunks received are concatenated along `concat_dim` in device order.
/// x (.., n*A, .., B, ..) -> (.., A, .., n*B, ..).
/// Transpose: all_to_all of the cotangent with split_dim and concat_dim swapped; no
/// assumption on the cotangent.
Tensor all_to_all(DeviceContext& ctx, const Tensor& x, const Axes& axes, int split_dim,
                  int concat_dim);

/// Identity that marks x as varying along `axes` from here on (enters a region whose
/// results are summed over devices).
/// Transpose: psum over `axes`; assumes each device's cotangent is its own contribution.
Tensor pvary(DeviceContext& ctx, const Tensor& x, const Axes& axes);

/// This device's index along `axes` (not differentiable; an int, as a static value).
int axis_index(const DeviceContext& ctx, const Axes& axes);
/// Number of devices along `axes`.
int axis_size(const DeviceContext& ctx, const Axes& axes);

/// `key` folded with this device's index along each of `axes` (DeviceContext::fold_rng_over_axis).
Key fold_rng_over_axis(const DeviceContext& ctx, const Key& key, const Axes& axes);

}  // namespace distjax::spmd
