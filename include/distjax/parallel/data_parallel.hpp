// Data parallelism: the model is replicated over the data axes, each device trains on
// its slice of the batch, and gradients are averaged over the data axes.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "distjax/mesh/mesh.hpp"
#include "distjax/mesh/partition_spec.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/tensor_tree.hpp"
#include "distjax/train/strategy.hpp"

namespace distjax::parallel {

using tensor::TensorTree;

/// The PartitionSpec of each parameter, by path (what nn::Scope records at init). A path
/// that is absent is replicated.
using ParamSpecs = nn::ParamSpecs;

/// Default bucket size of sync_grads: leaves are packed into buckets of at most this
/// many bytes, one all_reduce per bucket (fewer, larger messages than one per leaf).
constexpr std::size_t kDefaultBucketBytes = std::size_t{32} << 20;

/// The axes of `data_axes` the leaf at `path` is averaged over: those its spec in `specs`
/// does not shard it on (a Mixture-of-Experts leaf split over "expert" is averaged over
/// "data", the replicas that hold the same experts), in the order of `data_axes`.
std::vector<std::string> axes_to_average(const mesh::Axes& data_axes, const ParamSpecs* specs,
                                         const std::string& path);

/// Gradient synchronisation for data parallelism, per leaf: each f32 leaf of `grads` is
/// averaged over the axes of `data_axes` its parameter is NOT sharded on (its spec in
/// `specs`; absent = replicated) and left alone over the axes it is sharded on (a shard's
/// gradient is already its own). Leaves with the same axes to average are packed in path
/// order into buckets of at most `bucket_bytes`, one all_reduce (mean) per bucket over
/// ctx.comm(axes); the results are views into the buckets and no longer vary over the
/// averaged axes. Every device must pass the same paths and shapes (a mismatch is a
/// CommError naming the devices). Runs outside the tape, after the backward pass.
///
///   TensorTree g = autodiff::grad(loss_fn)(params, local_batch);
///   g = parallel::sync_grads(ctx, g, "data");   // now equal on every data replica
TensorTree sync_grads(spmd::DeviceContext& ctx, const TensorTree& grads,
                      const mesh::Axes& data_axes, const ParamSpecs* specs = nullptr,
                      std::size_t bucket_bytes = kDefaultBucketBytes);

/// The squared global norm of gradients spread over the mesh: each f32 leaf's local sum of
/// squares is summed over the mesh axes the leaf varies over (its shards; a replicated
/// leaf counts once), so every parameter of the model counts exactly once. Leaves with the
/// same varying axes share one exchange (an all_gather of f64 partial sums, added in
/// device order: the same value on every device). Every device must pass the same paths.
double global_norm_squared(spmd::DeviceContext& ctx, const TensorTree& grads);

/// Sums every metric's (sum, count) over the devices along `axes`, matched by name and
/// added in f64 in device order (exact and the same on every device). Every device must
/// report the same metric names; otherwise InvalidArgument names this device's.
train::Metrics sync_metrics(spmd::DeviceContext& ctx, const train::Metrics& metrics,
                            const mesh::Axes& axes);

/// How DataParallel runs (beside its mesh axes and the specs).
struct DataParallelOptions {
  /// Leaves are packed into buckets of at most this many bytes, one all-reduce per bucket.
  std::size_t bucket_bytes = kDefaultBucketBytes;
  /// forward_backward copies each gradient into a bucket as soon as the backward pass has
  /// finished with it (train::GradReadyFn: the last layer's first), and a full bucket's
  /// all-reduce starts at once while the backward pass goes on; finalize_grads waits for
  /// them. The same averages as sync_grads (views into the buckets, no other copy per
  /// leaf); only the bucket order differs (ready order). A train step without clipping or
  /// loss scaling then updates each bucket's parameters as soon as it arrives
  /// (finalize_and_update).
  bool overlap = true;
  /// The data axes over which parameters are stored fully sharded (nn::Scope::fully_sharded,
  /// ZeRO-3 / FSDP): the only data axes a parameter's spec may name.
  mesh::Axes fully_sharded{};
  /// The data axes over which Mixture-of-Experts layers split their experts (nn::MoE): a
  /// spec may name them too (the tokens travel to their expert's slice).
  mesh::Axes expert{};
  /// The axes whose index step_key folds into the dropout key (null: all of the data axes).
  /// Context parallelism averages over "data" and "context" but draws its dropout masks by
  /// global position, from the key of the data replica: {"data"}.
  std::optional<mesh::Axes> key_axes{};
};

/// The data-parallel Strategy. forward_backward treats each device's parameters as its own
/// copy along the data axes (so the tape does not sum their cotangents there) and its batch
/// as varying along them; finalize_grads is sync_grads; reduce_metrics is sync_metrics;
/// step_key folds the device's index along the data axes (different dropout masks per
/// replica). Parameters sharded over other axes (tensor parallelism) keep their own rules:
/// the tape sums the cotangents of replicated parameters over the axes their inputs vary on.
/// The first step lints `specs` (parallel::check_sharding): a parameter split over a data
/// axis that options.fully_sharded does not name is a ShardingError (each replica would
/// train its slice as the whole parameter: diverging replicas), as is a spec naming an
/// axis the mesh lacks.
///
///   parallel::DataParallel dp(ctx, "data", &specs);
///   train::train_step(state, local_batch, loss_fn, opt, {.strategy = &dp});
class DataParallel final : public train::Strategy {
 public:
  DataParallel(spmd::DeviceContext& ctx, mesh::Axes axes = "data",
               const ParamSpecs* specs = nullptr, DataParallelOptions options = {});
  ~DataParallel() override;

  Key step_key(const Key& key) override;
  train::GradientResult forward_backward(const train::LossFn& loss_fn, const TensorTree& params,
                                         const train::Batch& batch, const Key& key,
                                         int num_minibatches) override;
  TensorTree own_params(const TensorTree& params) override;
  train::Batch own_batch(const train::Batch& batch) override;
  TensorTree finalize_grads(TensorTree grads) override;
  /// With overlap and an optimizer that updates per leaf: the leaves no bucket carries
  /// first, then each bucket's leaves as soon as its all-reduce is done, in the order the
  /// buckets started, so the update of the first buckets runs while the last ones travel.
  /// The same values as finalize_grads then apply_update.
  TensorTree finalize_and_update(TensorTree grads, const optim::Optimizer& optimizer,
                                 TensorTree& params, TensorTree& opt_state,
                                 std::int64_t step) override;
  /// When this step's buckets are in flight (forward_backward ran with overlap; not when
  /// a pipeline ran the backward itself) and optimizer.updates_per_leaf().
  bool streams_update(const optim::Optimizer& optimizer) const override {
    return inflight_ != nullptr && optimizer.updates_per_leaf();
  }
  train::Metrics reduce_metrics(train::Metrics metrics) override;
  /// parallel::global_norm_squared (sharded leaves summed over their shards).
  double grad_norm_squared(const TensorTree& grads) override;

  const mesh::Axes& axes() const { return axes_; }
  /// With overlap: how many buckets of the step in flight have started their all-reduce
  /// (between forward_backward and finalize_grads, also from inside the backward pass);
  /// 0 otherwise.
  std::size_t started_buckets() const;

 private:
  struct Overlap;  // the buckets of the step in flight (data_parallel.cpp)

  spmd::DeviceContext* ctx_;
  mesh::Axes axes_;
  const ParamSpecs* specs_;
  DataParallelOptions options_;
  bool linted_ = false;
  std::unique_ptr<Overlap> inflight_;
  void lint_once();
};

}  // namespace distjax::parallel
