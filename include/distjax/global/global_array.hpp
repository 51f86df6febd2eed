// GlobalArray: the global view inside shard_map. On each device it holds this device's
// local tensor and the array's global shape and GlobalSharding; the global-view ops
// (global/elementwise.hpp, global/matmul.hpp and friends) run per device on the local
// tensors and insert the collectives their propagation rules choose. reshard /
// with_sharding_constraint move between layouts with the fewest bytes.
#pragma once

#include <cstdint>
#include <string>

#include "distjax/global/global_sharding.hpp"
#include "distjax/global/redistribute.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::global {

using spmd::DeviceContext;
using tensor::Tensor;

/// A global array of shape `shape()`, laid out by `sharding()`, seen from one device:
/// `local()` is this device's block (local_shape of the sharding), a partial sum along
/// the partial axes. Invariant: local() varies over (at least) every axis the sharding
/// splits or holds partial; it may also vary along a replicated axis (a gathered value
/// that feeds per-device work: its transpose is then a reduce-scatter).
///
///   // inside shard_map on a ("data"=2, "model"=4) mesh, x's in_spec P("data"):
///   GlobalArray x = GlobalArray::from_local(ctx, in[0], P("data", std::nullopt));
///   GlobalArray w = GlobalArray::from_local(ctx, in[1], P(std::nullopt, "model"));
///   GlobalArray h = matmul(x, w);        // P("data", "model"), no communication
///   GlobalArray r = reshard(h, P());    // one all_gather over (data, model)
class GlobalArray {
 public:
  GlobalArray() = default;
  /// Wraps this device's block: `local` must have local_shape(shape, sharding).
  GlobalArray(DeviceContext& ctx, Tensor local, Shape shape, GlobalSharding sharding);
  /// Wraps a block whose global shape follows from the sharding (shard_map inputs).
  static GlobalArray from_local(DeviceContext& ctx, Tensor local, GlobalSharding sharding);
  /// This device's block of a host array every device holds whole (a batch each process
  /// loaded): jax.device_put from inside the program. No communication.
  static GlobalArray from_host(DeviceContext& ctx, const Tensor& host, GlobalSharding sharding);
  /// A replicated array built from the same value on every device (a constant).
  static GlobalArray replicated(DeviceContext& ctx, Tensor value);

  bool defined() const { return ctx_ != nullptr; }
  DeviceContext& ctx() const { return *ctx_; }
  const Mesh& mesh() const { return ctx_->mesh(); }
  const Tensor& local() const { return local_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t size(int dim) const;
  const GlobalSharding& sharding() const { return sharding_; }
  DType dtype() const { return local_.dtype(); }
  /// "(8, 16) f32 P("data", None)".
  std::string str() const;

 private:
  DeviceContext* ctx_ = nullptr;
  Tensor local_;
  Shape shape_;
  GlobalSharding sharding_;
};

/// Moves `x` to `target` with the steps of plan_redistribution (all_gather,
/// all_to_all, psum, psum_scatter, local splits), each differentiable: the backward pass
/// runs their transposes (reduce-scatter, all_to_all, identity, all_gather, all_gather).
/// Every collective is recorded in the current plan under `op`.
/// `keep_varying`: axes (a mask) along which a gathered result may stay varying because
/// the consumer varies over them anyway (then its transpose is a reduce-scatter; else
/// the gathered value is replicated and its transpose keeps this device's block).
GlobalArray reshard(const GlobalArray& x, const GlobalSharding& target, const char* op = "reshard",
                    std::uint32_t keep_varying = 0);

/// JAX's with_sharding_constraint: reshard at this point of the program.
GlobalArray with_sharding_constraint(const GlobalArray& x, const GlobalSharding& target);

/// x resharded to P() with every partial sum resolved and a local value that varies
/// over no axis (what a replicated output of shard_map must be): a scalar loss.
GlobalArray replicate(const GlobalArray& x, const char* op = "replicate");

/// The bytes reshard(x, target) sends per device.
std::int64_t reshard_bytes(const GlobalArray& x, const GlobalSharding& target);

namespace detail {
/// Gives every input local the union of the inputs' varying axes before an op joins
/// them, recording in the plan the backward all-reduce the tape will run for each input
/// that needs a gradient and lacks some of the axes (the implicit pvary's transpose).
std::vector<Tensor> join_varying(const char* op, const std::vector<GlobalArray>& xs);
/// Mask of the axes a sharding splits or holds partial.
std::uint32_t sharding_mask(const DeviceContext& ctx, const GlobalSharding& s);
/// Records in the current plan (if any) `flops` of op computing a block laid out by
/// `output`: repeated along every mesh axis of size > 1 the layout leaves out.
void record_compute(const DeviceContext& ctx, const char* op, double flops,
                    const GlobalSharding& output);
}  // namespace detail

}  // namespace distjax::global
