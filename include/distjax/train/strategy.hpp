// Strategy: the seam between a train step and a way of running it over devices. The train
// step calls it and knows no strategy by name; data, tensor, fully sharded and pipeline
// parallelism implement it.
#pragma once

#include <string>

#include "distjax/core/memory_stats.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/optim/optimizer.hpp"
#include "distjax/train/loss.hpp"

namespace distjax::train {

using tensor::TensorTree;

/// What a train step asks of a parallelism strategy, in order: step_key, forward_backward,
/// finalize_grads, reduce_metrics, grad_norm_squared (clipping), apply_update; or, when
/// the update needs no global view of the gradients (no clipping, no loss scaling) and
/// streams_update(optimizer), step_key, forward_backward, finalize_and_update,
/// reduce_metrics, grad_norm_squared. The base
/// class is one device: every hook is the identity or the plain operation.
///
///   parallel::DataParallel dp(ctx, "data");
///   train::train_step(state, local_batch, loss_fn, opt, {.strategy = &dp});
class Strategy {
 public:
  /// What a strategy is, as data its constructor sets (the base: one device).
  struct Traits {
    /// Short name for logs ("single", "data(data=4)", ...).
    std::string name = "single";
    /// How many devices see different examples (global batch = local batch x this).
    int data_parallel_size = 1;
    /// Why this strategy cannot be the inner strategy of one that runs the forward and
    /// backward itself (a pipeline: own_params and own_batch, its own tape, then
    /// finalize_grads on what it computed, never this forward_backward); empty when it
    /// can. ZeRO-2 reduce-scatters inside its own forward_backward, so says why.
    std::string problem_as_inner{};
    /// Whether grad_norm_squared is the plain norm of the gradients this device holds (one
    /// device). Then, without loss scaling, the train step computes the norm and the clip
    /// factor on the device and reads neither (no host wait per step). A strategy that
    /// overrides grad_norm_squared sets it false.
    bool local_grad_norm = true;
    /// Where the train step reports the device's memory (spmd::DeviceContext::memory() of
    /// the device the strategy runs on); null for one device without a context.
    MemoryStats* memory = nullptr;
  };

  virtual ~Strategy() = default;
  const Traits& traits() const { return traits_; }
  const std::string& name() const { return traits_.name; }
  int data_parallel_size() const { return traits_.data_parallel_size; }
  const std::string& problem_as_inner() const { return traits_.problem_as_inner; }
  bool local_grad_norm() const { return traits_.local_grad_norm; }
  MemoryStats* memory_stats() const { return traits_.memory; }
  /// The key of this step on this device (dropout masks per data shard).
  virtual Key step_key(const Key& key) { return key; }
  /// Loss, metrics and gradients of `loss_fn` on this device's batch, accumulated over
  /// `num_minibatches` (train::accumulate_gradients).
  virtual train::GradientResult forward_backward(const train::LossFn& loss_fn,
                                                 const TensorTree& params, const train::Batch& batch,
                                                 const Key& key, int num_minibatches);
  /// The parameters as this device differentiates them: the same storage with the
  /// varying marks the strategy needs (data parallelism marks each replica's copy as its
  /// own along the data axes, so the tape does not sum the cotangents there). The base
  /// returns them unchanged. forward_backward applies it; a strategy that runs the
  /// backward itself around this one (a pipeline) calls it.
  virtual TensorTree own_params(const TensorTree& params) { return params; }
  /// This device's batch with its varying marks (data parallelism: along the data axes).
  virtual train::Batch own_batch(const train::Batch& batch) { return batch; }
  /// The gradients the optimizer applies (synchronised where the strategy needs it).
  virtual TensorTree finalize_grads(TensorTree grads) { return grads; }
  /// Metrics merged over the devices that saw different examples.
  virtual train::Metrics reduce_metrics(train::Metrics metrics) { return metrics; }
  /// The squared global norm of the (finalized) gradients of the whole model: every
  /// parameter counted once, however it is sharded. One device: the local sum of squares.
  virtual double grad_norm_squared(const TensorTree& grads);
  /// The optimizer state this device keeps for `params` (TrainState::create calls it).
  /// The base: optimizer.init(params). ZeRO keeps the state of this device's shard only.
  virtual TensorTree init_opt_state(const optim::Optimizer& optimizer, const TensorTree& params);
  /// Applies the optimizer to `params` (in place) with the finalized gradients. The base:
  /// optimizer.update. ZeRO updates this device's shard and all-gathers the result.
  virtual void apply_update(const optim::Optimizer& optimizer, TensorTree& params,
                            const TensorTree& grads, TensorTree& opt_state, std::int64_t step);
  /// finalize_grads and apply_update in one, for a step whose update needs no view of the
  /// whole gradient first (no clipping, no loss scaling): a strategy may update each part
  /// of the model as soon as its gradients are final, while the rest are still in flight
  /// (data parallelism with overlap: each bucket once its all-reduce is done, when
  /// optimizer.updates_per_leaf()). Returns the finalized gradients, as finalize_grads
  /// does. The base: finalize_grads, then apply_update.
  virtual TensorTree finalize_and_update(TensorTree grads, const optim::Optimizer& optimizer,
                                         TensorTree& params, TensorTree& opt_state,
                                         std::int64_t step);
  /// Whether finalize_and_update would update parts of the model as they become final
  /// with this optimizer (the train step then calls it instead of finalize_grads and
  /// apply_update). The base: false.
  virtual bool streams_update(const optim::Optimizer& optimizer) const {
    (void)optimizer;
    return false;
  }
  /// The optimizer state in the layout of the parameters, for a checkpoint: every slot
  /// leaf "<slot>/<path>" with the shape of this device's block of parameter <path>, so
  /// it is saved (and resharded) with the parameter's PartitionSpec. The base: the state
  /// as it is. ZeRO-1/2: the chunks all-gathered over the ZeRO axes (a collective).
  virtual TensorTree opt_state_to_param_layout(const TensorTree& opt_state,
                                               const TensorTree& params);
  /// The inverse: the state this device keeps, from one in the layout of the parameters
  /// (ZeRO: this device's chunks of it). No collective.
  virtual TensorTree opt_state_from_param_layout(const TensorTree& state,
                                                 const TensorTree& params);

 protected:
  Traits traits_{};
};

}  // namespace distjax::train
