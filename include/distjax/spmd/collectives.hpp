// Named-axis collectives on Tensors inside shard_map, each differentiable: forward and
// transpose are written together (docs/spmd.md, "Collectives and their transposes").
//
// Varying axes and the gradient convention (JAX's shard_map with vma checking, the one
// Megatron's regions follow). Every tensor inside shard_map carries the set of mesh axes
// it VARIES over (Tensor::varying_axes; DeviceContext::varying_axes names them): inputs
// vary over the axes their in_spec names; an ordinary op's result over the union of its
// inputs'; the collectives below say what theirs does. A value that does not vary along an
// axis is REPLICATED along it: one value held in n copies, counted once by the objective.
// The cotangent of a value has the value's varying axes, so the transposes follow:
//  - where a replicated value meets a varying one in an op, the tape inserts a pvary
//    (identity forward, psum of the cotangent backward: the per-device contributions
//    are summed), so no precondition is left to the caller;
//  - psum/pmean/pmax of an input that does not vary along some of `axes` pvary it first
//    (psum of a replicated x is n*x, with gradient n), then remove `axes`: the result is
//    replicated and its cotangent, equal along `axes`, passes through (identity, 1/n);
//  - all_gather, psum_scatter, ppermute and all_to_all give varying results; their
//    transposes (psum_scatter, all_gather, inverse ppermute, swapped all_to_all) take
//    each device's cotangent as its own contribution;
//  - all_gather_invariant gives a replicated result; its transpose keeps this device's
//    block of the (replicated) cotangent.
// shard_map checks that every output varies only over axes its out_spec names.
// ppermute and its asynchronous form are in spmd/ppermute.hpp.
//
#pragma once

#include <utility>
#include <vector>

#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::spmd {

using tensor::Tensor;

/// All-reduce sum over `axes`: every device gets the sum of x over its group (same shape,
/// any dtype; sums in fixed rank order on threads). x is first made to vary over `axes`
/// (pvary), so a replicated x gives n*x. Result: replicated along `axes`.
/// Transpose: identity (the cotangent of a replicated value is equal along `axes`).
Tensor psum(DeviceContext& ctx, const Tensor& x, const Axes& axes);

/// psum / n (same varying rule as psum). Transpose: cotangent / n.
Tensor pmean(DeviceContext& ctx, const Tensor& x, const Axes& axes);

/// Elementwise max over `axes` (f32; same varying rule as psum). Transpose: each
/// element's cotangent goes to the device of lowest axis_index holding the maximum (the
/// others get zero), like tensor::max over a stacked device dimension. A replicated x is
/// pvary'd first, so its cotangent is summed back to every device. (JAX defines no
/// transpose for pmax; this is the subgradient of the single-device max.)
Tensor pmax(DeviceContext& ctx, const Tensor& x, const Axes& axes);

/// Gathers x from every device of `axes` along `dim`: tiled, the pieces are concatenated
/// (x (.., S, ..) -> (.., n*S, ..)); not tiled, they are stacked in a new dimension at
/// `dim` (-> (.., n, S, ..)). Device i's piece is block i. Result: varies along `axes`
/// (it feeds per-device code whose results are summed, e.g. FSDP: gathered weights times
/// a per-device batch). Transpose: psum_scatter of the cotangent along `dim` (same tiling).
Tensor all_gather(DeviceContext& ctx, const Tensor& x, const Axes& axes, int dim = 0,
                  bool tiled = false);

/// all_gather whose result is REPLICATED along `axes` (JAX's all_gather_invariant): use it
/// when the gathered value feeds code that runs identically on every device (a replicated
/// loss, a replicated weight). Transpose: this device's block of the cotangent, no
/// communication.
Tensor all_gather_invariant(DeviceContext& ctx, const Tensor& x, const Axes& axes, int dim = 0,
                            bool tiled = false);

/// Reduce-scatter: sums x over `axes` and keeps block axis_index(axes) of the result
/// along `dim`: tiled, x (.., n*S, ..) -> (.., S, ..); not tiled, x (.., n, ..) -> the
/// dimension is removed.
/// Result: varies along `axes`. Transpose: all_gather of the cotangent along `dim`
/// (same tiling).
Tensor psum_scatter(DeviceContext& ctx, const Tensor& x, const Axes& axes, int dim = 0,
                    bool tiled = false);

/// All-to-all (tiled): x is split into n chunks along `split_dim`; chunk j goes to device
/// j; the chunks received are concatenated along `concat_dim` in device order.
/// x (.., n*A, .., B, ..) -> (.., A, .., n*B, ..).
/// Result: varies along `axes`. Transpose: all_to_all of the cotangent with split_dim
/// and concat_dim swapped.
Tensor all_to_all(DeviceContext& ctx, const Tensor& x, const Axes& axes, int split_dim,
                  int concat_dim);

/// Ragged all-to-all along dimension 0: device i sends rows [o_j, o_j + send_counts[j]) of x
/// (o_j the sum of the counts before j) to device j of `axes`; the result holds, in device
/// order, the recv_counts[i] rows device i sent here. Counts first, then the rows: the
/// caller knows both (a Mixture-of-Experts dispatch exchanges its counts beforehand). The
/// rows travel as they are in the communicator's all_to_allv where the backend has one
/// (threads, MPI); elsewhere (NCCL, for now) padded to `block` rows per device (the same on
/// every device, at least every count of the exchange) in one tiled all_to_all; `block`
/// bounds the counts either way. x (sum send_counts, ...) ->
/// (sum recv_counts, ...). Result: varies along `axes`. Transpose: the ragged all_to_all of
/// the cotangent back (the counts swapped). In two halves, to compute while the rows
/// travel: ragged_all_to_all_start / ragged_all_to_all_done (ragged.hpp).
Tensor ragged_all_to_all(DeviceContext& ctx, const Tensor& x, const Axes& axes,
                         const std::vector<std::int64_t>& send_counts,
                         const std::vector<std::int64_t>& recv_counts, std::int64_t block);

/// Identity that marks x as varying along `axes` from here on (enters a region whose
/// results are summed over devices). Ops insert it implicitly where a replicated value
/// meets a varying one; calling it on axes x already varies over is the identity.
/// Transpose: psum over the axes x did not vary over.
Tensor pvary(DeviceContext& ctx, const Tensor& x, const Axes& axes);

/// This device's index along `axes` (not differentiable; an int, as a static value).
int axis_index(const DeviceContext& ctx, const Axes& axes);
/// Number of devices along `axes`.
int axis_size(const DeviceContext& ctx, const Axes& axes);

/// `key` folded with this device's index along each of `axes` (DeviceContext::fold_rng_over_axis).
Key fold_rng_over_axis(const DeviceContext& ctx, const Key& key, const Axes& axes);

}  // namespace distjax::spmd
