// The loss-function contract and gradient accumulation: the vocabulary a train step and
// the parallel strategies share (they depend on tensor, autodiff and these value types only).
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "distjax/core/prng.hpp"
#include "distjax/tensor/tensor_tree.hpp"
#include "distjax/train/batch.hpp"
#include "distjax/train/metrics.hpp"

namespace distjax::train {

using tensor::TensorTree;

/// The loss-function contract: (params, batch, rng) -> {scalar mean loss over the batch,
/// metrics as (sum, count) pairs}. The loss must be the mean over the examples of the
/// batch so that averaging equal minibatches gives the full-batch loss. When the
/// metrics have no "loss" entry, the step adds one as (loss * B, B).
///
/// Under a pipeline (parallel::Pipeline) the loss function takes the last chunk's place on
/// the last stage, once per micro-batch: batch.inputs is the activation that chunk receives
/// (on the tape), batch.labels the micro-batch's labels (Pipeline::module_loss()).
using LossFn = std::function<std::pair<Tensor, Metrics>(const TensorTree& params,
                                                        const Batch& batch, Key rng)>;

/// Loss, metrics and mean gradient over `num_minibatches` equal slices of `batch`
/// (loop form: one slice's activations alive at a time). Minibatch i gets the key
/// rng.fold_in(i) (rng itself when num_minibatches == 1). The result equals the
/// full-batch gradient for a mean loss. Throws InvalidArgument when the batch size is
/// not divisible by num_minibatches.
struct GradientResult {
  TensorTree grads;  ///< same paths as params
  /// Merged over the minibatches. "loss" is the loss function's own metric, or else the
  /// minibatch losses weighted by their examples (their mean), still on the device.
  Metrics metrics;
};
GradientResult accumulate_gradients(const LossFn& loss_fn, const TensorTree& params,
                                    const Batch& batch, Key rng, int num_minibatches);

/// Called with a parameter's path and its final (mean) gradient as soon as the backward
/// pass of the last minibatch has finished with it (autodiff::GradReadyFn), while the
/// backward pass goes on: data parallelism starts averaging it at once. The tensor is
/// only valid during the call: copy what you keep.
using GradReadyFn = std::function<void(const std::string& path, const Tensor& grad)>;

/// accumulate_gradients that reports each gradient to `on_ready` as soon as it is final
/// (the same values as the returned grads).
GradientResult accumulate_gradients(const LossFn& loss_fn, const TensorTree& params,
                                    const Batch& batch, Key rng, int num_minibatches,
                                    const GradReadyFn& on_ready);

}  // namespace distjax::train
