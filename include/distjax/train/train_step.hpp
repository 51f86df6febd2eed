// The train step: loss and gradients (accumulated over minibatches), optional
// global-norm clipping, and the optimizer update, in place on a TrainState.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/mesh/mesh.hpp"
#include "distjax/optim/optimizer.hpp"
#include "distjax/train/batch.hpp"
#include "distjax/train/metrics.hpp"
#include "distjax/train/train_state.hpp"

namespace distjax::spmd {
class DeviceContext;
}

namespace distjax::train {

/// Data parallelism for train_step: inside shard_map, each device passes its slice of
/// the global batch; gradients are averaged (parallel::sync_grads) and metrics summed
/// over `axes`, so every replica applies the same update. Dropout keys are folded over
/// `axes`, so replicas draw different masks.
struct DataParallel {
  spmd::DeviceContext* ctx = nullptr;  ///< this device's context; null = single device
  mesh::Axes axes = "data";
  bool enabled() const { return ctx != nullptr; }
  /// Number of replicas along `axes` (1 when disabled).
  int size() const;
};

/// The loss-function contract: (params, batch, rng) -> {scalar mean loss over the batch,
/// metrics as (sum, count) pairs}. The loss must be the mean over the examples of the
/// batch so that averaging equal minibatches gives the full-batch loss. When the
/// metrics have no "loss" entry, the step adds one as (loss * B, B).
using LossFn = std::function<std::pair<Tensor, Metrics>(const TensorTree& params,
                                                        const Batch& batch, Key rng)>;

/// Options of train_step.
struct TrainStepOptions {
  /// Gradient accumulation: the batch is cut into this many equal slices, run one at
  /// a time, and their gradients averaged. The batch size must be divisible by it.
  int num_minibatches = 1;
  /// Clip the gradient to this global norm before the update; 0 disables clipping.
  double max_grad_norm = 0.0;
  /// Average gradients over data-parallel replicas (off by default).
  DataParallel data_parallel{};
};

/// Sums every metric's (sum, count) over the devices along `axes` (an all_reduce over
/// ctx.comm(axes)); every device must hold the same metric names.
Metrics sync_metrics(spmd::DeviceContext& ctx, const Metrics& metrics, const mesh::Axes& axes);

/// Loss, metrics and mean gradient over `num_minibatches` equal slices of `batch`
/// (loop form: one slice's activations alive at a time). Minibatch i gets the key
/// rng.fold_in(i) (rng itself when num_minibatches == 1). The result equals the
/// full-batch gradient for a mean loss. Throws InvalidArgument when the batch size is
/// not divisible by num_minibatches.
struct GradientResult {
  TensorTree grads;   ///< same paths as params
  double loss = 0.0;  ///< mean of the minibatch losses
  Metrics metrics;    ///< merged over the minibatches
};
GradientResult accumulate_gradients(const LossFn& loss_fn, const TensorTree& params,
                                    const Batch& batch, Key rng, int num_minibatches);

/// One optimisation step on `state` (in place): gradients with the key
/// state.rng.fold_in(state.step) (folded over the data axes when data-parallel),
/// gradient and metric synchronisation when options.data_parallel is enabled, optional
/// clipping, optimizer update, step += 1.
/// Returns the metrics of the batch plus "grad_norm" and "learning_rate" (count 1).
Metrics train_step(TrainState& state, const Batch& batch, const LossFn& loss_fn,
                   const optim::Optimizer& optimizer, const TrainStepOptions& options = {});

/// Metrics of `loss_fn` over one batch with grad mode off (train == false is up to the
/// loss function; `rng` is passed through).
Metrics eval_step(const TensorTree& params, const Batch& batch, const LossFn& loss_fn, Key rng);

/// eval_step over every batch, merged (batch i gets rng.fold_in(i)).
Metrics evaluate(const TensorTree& params, const std::vector<Batch>& batches, const LossFn& loss_fn,
                 Key rng);

}  // namespace distjax::train
