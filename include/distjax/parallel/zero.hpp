// ZeRO stages 1 and 2 (DeepSpeed): data parallelism whose optimizer state (stage 1) and
// gradients (stage 2) are split over the data axes; each device updates its shard of every
// parameter and the shards are all-gathered. Stage 3 (parameters stored sharded, gathered
// on use) is nn::Scope::fully_sharded (nn/scope.hpp, gathers in nn/fsdp_gather.hpp).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "distjax/parallel/data_parallel.hpp"
#include "distjax/train/strategy.hpp"
#include "distjax/spmd/device_context.hpp"

namespace distjax::parallel {

using tensor::TensorTree;

/// ZeRO-1 or ZeRO-2 over `axes` (n devices). Every f32 parameter replicated along `axes`
/// is split, per leaf, into n equal chunks of its flattened elements (the last padded
/// with zeros): device r owns chunk r. A step then:
///  - reduce-scatters the gradients (mean) in buckets, so device r holds the averaged
///    gradient of its chunks only, marked as varying over `axes`;
///  - clips with the norm of the whole model (chunks summed over `axes`);
///  - runs the optimizer on its chunks (optimizer state: chunks only, 8 bytes per
///    parameter / n for Adam), and all-gathers the updated chunks into every replica.
/// Stage 1 reduce-scatters once per step into a full-size gradient buffer that stays
/// allocated (4 bytes per parameter); stage 2 reduce-scatters after every minibatch of
/// gradient accumulation and keeps only the chunks (4 bytes per parameter / n).
/// Communication per step: a reduce-scatter of the gradients and an all-gather of the
/// parameters, 2 (n-1)/n x gradient bytes, as plain data parallelism's all-reduce.
/// A parameter sharded over some of the data axes already (its spec names them: experts
/// split over "expert") is split over the others, the replicas that hold the same shard
/// (averaged, reduce-scattered and gathered over those alone); one sharded over every
/// data axis is left to sync_grads' rules and updated whole. Results equal DataParallel's
/// up to f32 summation order.
///
///   parallel::ZeroDataParallel zero(ctx, 2, "data", &specs);
///   auto state = train::TrainState::create(params, opt, key, zero);  // sharded state
///   train::train_step(state, local_batch, loss_fn, opt, {.strategy = &zero});
class ZeroDataParallel final : public train::Strategy {
 public:
  /// `options` as DataParallel's: the bucket size, the expert axes (experts split over them
  /// are split by ZeRO over the other data axes), the dropout key's axes; overlap is ZeRO's
  /// own and fully_sharded must be empty (stage 3 is FSDP).
  ZeroDataParallel(spmd::DeviceContext& ctx, int stage, mesh::Axes axes = "data",
                   const ParamSpecs* specs = nullptr, DataParallelOptions options = {});

  Key step_key(const Key& key) override { return dp_.step_key(key); }
  train::GradientResult forward_backward(const train::LossFn& loss_fn, const TensorTree& params,
                                         const train::Batch& batch, const Key& key,
                                         int num_minibatches) override;
  TensorTree own_params(const TensorTree& params) override { return dp_.own_params(params); }
  train::Batch own_batch(const train::Batch& batch) override { return dp_.own_batch(batch); }
  /// ZeRO-1: none. ZeRO-2: its forward_backward reduce-scatters each gradient as the
  /// backward produces it, which a strategy running the backward itself would skip.
  TensorTree finalize_grads(TensorTree grads) override;
  train::Metrics reduce_metrics(train::Metrics metrics) override {
    return dp_.reduce_metrics(std::move(metrics));
  }
  double grad_norm_squared(const TensorTree& grads) override;
  TensorTree init_opt_state(const optim::Optimizer& optimizer, const TensorTree& params) override;
  void apply_update(const optim::Optimizer& optimizer, TensorTree& params, const TensorTree& grads,
                    TensorTree& opt_state, std::int64_t step) override;
  /// Each split leaf's slots all-gathered over the axes (one all_gather per slot leaf, in
  /// path order) and cut back to the parameter's shape: what a checkpoint saves.
  TensorTree opt_state_to_param_layout(const TensorTree& opt_state,
                                       const TensorTree& params) override;
  /// This device's chunk of each split leaf's slots.
  TensorTree opt_state_from_param_layout(const TensorTree& state,
                                         const TensorTree& params) override;

  int stage() const { return stage_; }

 private:
  // The axes ZeRO splits this leaf over: the data axes its gradient is averaged over
  // (axes_to_average: every one for a replicated leaf, the data replicas holding the same
  // experts for an expert split over "expert"); empty when it is not split (not f32, or
  // sharded over every data axis).
  mesh::Axes split_axes(const std::string& path, const tensor::Tensor& t) const;
  // The split leaves (path, elements) grouped by their split axes, the groups in the order
  // of their first leaf: the same on every device.
  struct SplitGroup {
    mesh::Axes axes;
    std::vector<std::pair<std::string, std::int64_t>> leaves;
  };
  std::vector<SplitGroup> split_groups(const TensorTree& tree) const;
  // This device's chunks of the split leaves (the others unchanged).
  TensorTree own_chunks(const TensorTree& params) const;
  // The parameter an optimizer state path "<slot>/<param path>" belongs to and the axes
  // ZeRO splits it over, when it does (null otherwise).
  std::pair<const tensor::Tensor*, mesh::Axes> split_param_of(const std::string& state_path,
                                                               const TensorTree& params) const;
  // Reduce-scatters the split leaves' gradients (mean); the others go through sync_grads.
  // keep_full: the chunks are views into the full-size gradient buffer (stage 1).
  TensorTree scatter_grads(const TensorTree& grads, bool keep_full);

  spmd::DeviceContext* ctx_;
  int stage_;
  mesh::Axes axes_;
  const ParamSpecs* specs_;
  std::size_t bucket_bytes_;
  DataParallel dp_;
};

}  // namespace distjax::parallel
