#include "distjax/train/train_step.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/optim/clip.hpp"
#include "distjax/train/strategy.hpp"
#include "distjax/tensor/device_memory.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/update_ops.hpp"

namespace distjax::train {

namespace {

const Tensor& scalar_loss(const Tensor& loss) {
  DISTJAX_CHECK(loss.defined() && loss.numel() == 1, InvalidArgument,
                "[train_step] the loss function must return a scalar loss, got ",
                loss.defined() ? to_string(loss.shape()) : std::string("undefined"));
  return loss;
}

// Adds ("loss", loss * B, B) unless the loss function reported "loss" itself. The loss
// stays where it was computed until the metric is read.
void add_default_loss(Metrics& m, const Tensor& loss, std::int64_t batch_size) {
  const auto b = static_cast<double>(batch_size);
  if (!m.contains("loss")) m.add("loss", scalar_loss(loss), b, b);
}

// acc += g (f32 leaves): each leaf of acc replaced by the sum (the same f32 additions as
// an accumulation in place, which leaves may take once the tensor layer has one).
void add_into(TensorTree& acc, const TensorTree& g) {
  for (auto& [path, a] : acc)
    if (a.dtype() == DType::F32) a = tensor::add(a, g.at(path));
}

// The device kind whose memory a step's accounting counts: that of the parameters.
DeviceKind memory_kind(const TensorTree& params) {
  for (const auto& [path, p] : params)
    if (p.defined()) return p.device().kind;
  return current_device().kind;
}

// Gradient leaves may share storage (one cotangent handed to two inputs, views of
// one buffer); clipping and accumulation write in place, so give each leaf its own.
TensorTree owned(TensorTree grads) {
  std::vector<Tensor> seen;
  for (auto& [path, g] : grads) {
    for (const Tensor& s : seen) {
      if (g.shares_storage_with(s)) {
        g = g.clone();
        break;
      }
    }
    seen.push_back(g);
  }
  return grads;
}

// `loss_fn` with its loss multiplied by `scale` (f16 loss scaling); the metrics keep the
// unscaled loss.
LossFn scaled_loss(const LossFn& loss_fn, double scale) {
  return [&loss_fn, scale](const TensorTree& params, const Batch& batch, Key rng) {
    auto [loss, metrics] = loss_fn(params, batch, rng);
    add_default_loss(metrics, loss, batch.size());
    return std::make_pair(tensor::mul_scalar(loss, scale), std::move(metrics));
  };
}

}  // namespace

GradientResult accumulate_gradients(const LossFn& loss_fn, const TensorTree& params,
                                    const Batch& batch, Key rng, int num_minibatches) {
  return accumulate_gradients(loss_fn, params, batch, rng, num_minibatches, GradReadyFn{});
}

GradientResult accumulate_gradients(const LossFn& loss_fn, const TensorTree& params,
                                    const Batch& batch, Key rng, int num_minibatches,
                                    const GradReadyFn& on_ready) {
  const std::int64_t b = batch.size();
  DISTJAX_CHECK(num_minibatches >= 1, InvalidArgument,
                "[accumulate_gradients] num_minibatches must be >= 1, got ", num_minibatches);
  DISTJAX_CHECK(b % num_minibatches == 0, InvalidArgument, "[accumulate_gradients] batch size ", b,
                " is not divisible by num_minibatches ", num_minibatches,
                "; choose a batch size that is a multiple of it (examples are never dropped)");
  const std::int64_t mb = b / num_minibatches;
  GradientResult out;
  TensorTree last;  // the final gradients, when they are reported as they become ready
  for (int i = 0; i < num_minibatches; ++i) {
    const Batch part = num_minibatches == 1 ? batch : batch.slice(i * mb, (i + 1) * mb);
    const Key key = num_minibatches == 1 ? rng : rng.fold_in(static_cast<std::uint64_t>(i));
    TensorTree leaves = autodiff::detail::make_leaves(params);
    std::pair<Tensor, Metrics> res = [&] {
      tensor::EnableGradGuard on;
      return loss_fn(std::as_const(leaves), part, key);
    }();
    std::function<void(const std::string&, const Tensor&)> ready;
    if (on_ready && i == num_minibatches - 1) {
      // The last minibatch completes each gradient: report (sum of the others + g) / n.
      ready = [&](const std::string& path, const Tensor& g) {
        tensor::NoGradGuard no_grad;
        Tensor final_g = g;
        if (num_minibatches > 1) {
          if (g.dtype() == DType::F32) {
            final_g = tensor::add(g, out.grads.at(path));  // a new tensor: g stays as it was
            tensor::scale_(final_g, 1.0 / num_minibatches);
          } else {
            final_g = g.clone();
          }
        }
        last.set(path, final_g);
        on_ready(path, final_g);
      };
    }
    TensorTree grads = autodiff::detail::grads_of(scalar_loss(res.first), leaves, ready);
    add_default_loss(res.second, res.first, part.size());
    out.metrics.merge(res.second);
    tensor::NoGradGuard no_grad;
    if (ready) {
      out.grads = owned(std::move(last));
    } else if (i == 0) {
      out.grads = owned(std::move(grads));
    } else {
      add_into(out.grads, grads);
    }
  }
  if (num_minibatches > 1 && !on_ready) optim::scale_in_place(out.grads, 1.0 / num_minibatches);
  return out;
}

Metrics train_step(TrainState& state, const Batch& batch, const LossFn& loss_fn,
                   const optim::Optimizer& optimizer, const TrainStepOptions& options) {
  train::Strategy single;
  train::Strategy& strategy = options.strategy ? *options.strategy : single;
  const Key rng = strategy.step_key(state.rng.fold_in(static_cast<std::uint64_t>(state.step)));
  MemoryStats* memory = strategy.memory_stats();
  const DeviceKind kind = memory_kind(state.params);
  const std::int64_t live_before = tensor::live_bytes(kind);
  if (memory) tensor::reset_peak_bytes(kind);
  const double loss_scale = state.loss_scale ? state.loss_scale->scale : 1.0;
  DISTJAX_CHECK(loss_fn || !state.loss_scale, InvalidArgument,
                "[train_step] loss scaling scales the loss function, and none was given; a "
                "strategy that computes its model's loss takes it as a loss function too (a "
                "pipeline: Pipeline::module_loss())");
  // A span boundary: on a GPU the device's time (the host waits for its stream first; only
  // steps that record spans pay it), the host's where kernels run at once.
  auto now = [] {
    tensor::raw::synchronize("timeline", current_device());
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  if (options.spans) options.spans->start = now();
  GradientResult r;
  {
    // A loss added deep in the model (autodiff::add_loss) is scaled as the objective is.
    const autodiff::ObjectiveScale objective(loss_scale);
    r = strategy.forward_backward(state.loss_scale ? scaled_loss(loss_fn, loss_scale) : loss_fn,
                                  state.params, batch, rng, options.num_minibatches);
  }
  if (memory) memory->activations_peak = tensor::peak_bytes(kind) - live_before;
  if (options.spans) options.spans->forward_backward_end = now();
  const double lr = optimizer.learning_rate(state.step);
  double norm = 0.0;
  Tensor device_norm;  // the norm where the device left it (reported without a host wait)
  if (options.max_grad_norm <= 0.0 && !state.loss_scale && strategy.streams_update(optimizer)) {
    // Nothing about the update depends on the whole gradient: the strategy updates each
    // part as soon as it is final (data parallelism: bucket by bucket). The norm is only
    // reported.
    r.grads = strategy.finalize_and_update(std::move(r.grads), optimizer, state.params,
                                           state.opt_state, state.step);
    r.metrics = strategy.reduce_metrics(std::move(r.metrics));
    norm = std::sqrt(strategy.grad_norm_squared(r.grads));
    if (options.spans) {
      options.spans->update_streamed = true;
      options.spans->sync_end = options.spans->update_end = now();
    }
  } else {
    r.grads = strategy.finalize_grads(std::move(r.grads));
    r.metrics = strategy.reduce_metrics(std::move(r.metrics));
    if (!state.loss_scale && strategy.local_grad_norm()) {
      // One device: nothing on the host decides on the norm, so the device computes it and
      // the clip factor (1 when not clipping or below the bound) and scales by it: the
      // step queues its work and returns without waiting. The same bits as below.
      const tensor::NormAndClipFactor clip =
          optim::norm_and_clip_factor(r.grads, std::max(options.max_grad_norm, 0.0));
      device_norm = clip.norm;
      if (options.spans) options.spans->sync_end = now();
      if (options.max_grad_norm > 0.0) optim::scale_in_place(r.grads, clip.factor);
      strategy.apply_update(optimizer, state.params, r.grads, state.opt_state, state.step);
    } else {
      // The norm of the whole model's gradient (sharded leaves summed over their shards):
      // one value on every device, so it is also where every device learns whether any
      // gradient anywhere overflowed (inf or nan), and all skip or apply the update alike.
      norm = std::sqrt(strategy.grad_norm_squared(r.grads)) / loss_scale;
      const bool finite = std::isfinite(norm);
      if (options.spans) options.spans->sync_end = now();
      double factor = 1.0 / loss_scale;  // unscale and clip in one pass
      if (options.max_grad_norm > 0.0 && norm > options.max_grad_norm)
        factor *= options.max_grad_norm / norm;
      if (factor != 1.0 && (finite || !state.loss_scale)) optim::scale_in_place(r.grads, factor);
      if (finite || !state.loss_scale)
        strategy.apply_update(optimizer, state.params, r.grads, state.opt_state, state.step);
      if (state.loss_scale) state.loss_scale->update(finite);
    }
    if (options.spans) options.spans->update_end = now();
  }
  if (state.loss_scale) {
    r.metrics.add("loss_scale", loss_scale, 1.0);
    r.metrics.add("skipped_steps", static_cast<double>(state.loss_scale->skipped_steps), 1.0);
  }
  if (memory) {
    memory->parameters = state.params.storage_bytes();
    memory->gradients = r.grads.storage_bytes();
    memory->optimizer_state = state.opt_state.storage_bytes();
  }
  state.step += 1;
  // Reported in f32, like the gradients, by either branch: one device's and a mesh's runs
  // report the same number.
  if (device_norm.defined())
    r.metrics.add("grad_norm", device_norm, 1.0, 1.0);
  else
    r.metrics.add("grad_norm", static_cast<float>(norm), 1.0);
  r.metrics.add("learning_rate", lr, 1.0);
  return r.metrics;
}

Metrics eval_step(const TensorTree& params, const Batch& batch, const LossFn& loss_fn, Key rng) {
  tensor::NoGradGuard no_grad;
  auto [loss, m] = loss_fn(params, batch, rng);
  add_default_loss(m, loss, batch.size());
  return m;
}

Metrics evaluate(const TensorTree& params, const std::vector<Batch>& batches, const LossFn& loss_fn,
                 Key rng) {
  Metrics total;
  for (std::size_t i = 0; i < batches.size(); ++i)
    total.merge(eval_step(params, batches[i], loss_fn, rng.fold_in(static_cast<std::uint64_t>(i))));
  return total;
}

}  // namespace distjax::train
