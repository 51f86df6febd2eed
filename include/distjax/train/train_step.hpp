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
#include "distjax/train/loss.hpp"
#include "distjax/train/metrics.hpp"
#include "distjax/train/train_state.hpp"

namespace distjax::train {

/// When the phases of one train step ended, in seconds on the steady clock (a run's
/// timeline): forward and backward (compute; under data parallelism with overlap this
/// also issues the gradient all-reduces), gradient synchronisation (finalize_grads,
/// reduce_metrics and the global norm: communication), and the optimizer update.
/// Without clipping and loss scaling, under a strategy that streams the update
/// (Strategy::streams_update: a data-parallel step with overlap updates each bucket as it
/// arrives), the update runs inside the synchronisation: `update_streamed` is then true
/// and sync_end == update_end.
struct StepSpans {
  double start = 0.0;
  double forward_backward_end = 0.0;
  double sync_end = 0.0;
  double update_end = 0.0;
  bool update_streamed = false;
};

/// Options of train_step.
struct TrainStepOptions {
  /// Gradient accumulation: the batch is cut into this many equal slices, run one at
  /// a time, and their gradients averaged. The batch size must be divisible by it.
  int num_minibatches = 1;
  /// Clip the gradient to this global norm before the update; 0 disables clipping.
  double max_grad_norm = 0.0;
  /// How the step runs over devices (train/strategy.hpp; data, tensor, fully sharded,
  /// pipeline parallelism); null = one device. Not owned.
  train::Strategy* strategy = nullptr;
  /// Filled with the step's phase times when given. Not owned.
  StepSpans* spans = nullptr;
};

/// One optimisation step on `state` (in place), through options.strategy: key
/// strategy.step_key(state.rng.fold_in(state.step)), forward_backward, finalize_grads,
/// reduce_metrics, optional clipping, optimizer update, step += 1. Without clipping and
/// loss scaling, under a strategy that streams_update(optimizer), finalize_grads and the
/// update are one call (Strategy::finalize_and_update): each part of the model is updated
/// as soon as its gradients are final.
/// Returns the metrics of the batch plus "grad_norm" and "learning_rate" (count 1).
/// With state.loss_scale (f16 training): the loss is scaled, the gradients unscaled, a
/// step with a non-finite gradient on any device is skipped on every device, and the
/// metrics add "loss_scale" and "skipped_steps" (train/loss_scale.hpp). The scaling wraps
/// `loss_fn`, so it needs one: a strategy that may take null (a pipeline, whose module
/// computes its loss) has it as a LossFn too (parallel::Pipeline::module_loss()).
Metrics train_step(TrainState& state, const Batch& batch, const LossFn& loss_fn,
                   const optim::Optimizer& optimizer, const TrainStepOptions& options = {});

/// Metrics of `loss_fn` over one batch with grad mode off (train == false is up to the
/// loss function; `rng` is passed through).
Metrics eval_step(const TensorTree& params, const Batch& batch, const LossFn& loss_fn, Key rng);

/// eval_step over every batch, merged (batch i gets rng.fold_in(i)).
Metrics evaluate(const TensorTree& params, const std::vector<Batch>& batches, const LossFn& loss_fn,
                 Key rng);

}  // namespace distjax::train
