// The training loop of app::train (detail/loop.hpp) and the policies of a run it reads from
// the config (run.hpp).
#include "distjax/app/run.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "distjax/app/detail/loop.hpp"
#include "distjax/comm/comm_stats.hpp"
#include "distjax/comm/launch_environment.hpp"
#include "distjax/config/config_file.hpp"
#include "distjax/data/prefetch.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/train/checkpoint.hpp"

namespace distjax::app {

namespace {

train::Resume resume_of(config::Resume r) {
  switch (r) {
    case config::Resume::Required:
      return train::Resume::Required;
    case config::Resume::Auto:
      return train::Resume::Auto;
    case config::Resume::Off:
      break;
  }
  return train::Resume::Off;
}

// The loop's state on one device: the checkpoints, the Trainer, the evaluations.
class DeviceRun {
 public:
  explicit DeviceRun(const detail::Loop& loop)
      : loop_(loop),
        state_(*loop.state),
        lead_(loop.ctx == nullptr || loop.ctx->device() == 0),
        ckpt_(checkpoint_config(*loop.config), layout(loop)) {}

  RunResult run() {
    RunResult result;
    result.resumed = restore();
    if (result.resumed && state_.step >= loop_.total_steps) return already_finished(result);
    train::Trainer trainer(trainer_config(result.resumed), *loop_.optimizer,
                           loop_.composed->loss(true),
                           {.num_minibatches = static_cast<int>(loop_.config->run.grad_accum_steps),
                            .max_grad_norm = loop_.config->optimizer.max_grad_norm,
                            .strategy = &loop_.composed->strategy()});
    if (loop_.eval_at_start) result.initial_eval = evaluate(trainer);
    const std::int64_t steps = loop_.total_steps;
    if (loop_.prefetch && loop_.loader == nullptr)
      ahead_ = std::make_unique<data::Prefetcher>(loop_.batch);
    const auto t0 = std::chrono::steady_clock::now();
    while (state_.step < steps) {
      step(trainer);
      // A step's loss may still be on the device: nothing non-finite is saved.
      if (ckpt_.due(state_)) trainer.check_finite();
      ckpt_.maybe_save(state_, position());
      if (loop_.stoppable && stop_agreed()) {
        result.stopped = true;
        if (lead_)
          std::printf("\nStopped at step %lld of %lld (asked to stop)\n",
                      static_cast<long long>(state_.step), static_cast<long long>(steps));
        break;
      }
      if (loop_.eval_every > 0 && state_.step % loop_.eval_every == 0 && state_.step < steps)
        evaluate(trainer);
    }
    trainer.check_finite();
    ahead_.reset();
    const double loop_s = seconds_since(t0);
    result.checkpoint = ckpt_.save(state_, position());
    std::map<std::string, double> summary;
    if (loop_.after_training) summary = loop_.after_training();
    comm_report(summary);
    summary["data_wait_s"] = data_wait_s_;
    summary["data_wait_fraction"] = loop_s > 0 ? data_wait_s_ / loop_s : 0.0;
    if (lead_)
      std::printf("Data: the steps waited %.2f%% of the loop's time for their batches (%s)\n",
                  100.0 * summary["data_wait_fraction"],
                  loop_.prefetch && loop_.loader == nullptr ? "made ahead on a host thread"
                                                            : "made by the step");
    result.eval = evaluate(trainer);
    if (loop_.summary) summary.merge(loop_.summary(result));
    if (loop_.model_parameters > 0)
      summary["num_parameters"] = static_cast<double>(loop_.model_parameters);
    trainer.finish(state_, summary);
    if (lead_ && ckpt_.config().saves)
      std::printf("Checkpoint: %s (continue with --resume; list with distjax ckpt inspect)\n",
                  train::find_checkpoint(ckpt_.config().dir).value_or(result.checkpoint).c_str());
    return result;
  }

 private:
  // Whether any device saw a stop request: every device, after the same step, the same
  // answer (a device that saw none yet still stops with the others).
  bool stop_agreed() const {
    const double local = stop_requested() ? 1.0 : 0.0;
    if (loop_.ctx == nullptr) return local > 0;
    const tensor::Tensor flag = tensor::Tensor::scalar(local);
    return spmd::pmax(*loop_.ctx, flag, loop_.ctx->mesh().axis_names()).item<float>() > 0;
  }

  // Where this device's communication went, by group of mesh axes (the whole run, setup
  // included): summary.json's comm_s/<axes>, comm_wait_s/<axes>, comm_calls/<axes>, and a
  // line from device 0. A slow link shows as the seconds per call of the axes crossing it.
  void comm_report(std::map<std::string, double>& summary) const {
    if (loop_.ctx == nullptr) return;
    const comm::CommStats& stats = loop_.ctx->comm_stats();
    std::string line;
    for (const std::string& axes : stats.group_labels()) {
      if (axes.empty()) continue;  // the group of one device
      comm::OpCounters total;
      for (const comm::OpCounters& c : *stats.for_group(axes)) {
        total.calls += c.calls;
        total.seconds += c.seconds;
        total.wait_seconds += c.wait_seconds;
      }
      if (total.calls == 0) continue;
      summary["comm_s/" + axes] = total.seconds;
      summary["comm_wait_s/" + axes] = total.wait_seconds;
      summary["comm_calls/" + axes] = static_cast<double>(total.calls);
      char part[160];
      std::snprintf(part, sizeof part, "%s%s %.2f s in %lld calls (%.2f ms each, %.0f%% waiting)",
                    line.empty() ? "" : "; ", axes.c_str(), total.seconds,
                    static_cast<long long>(total.calls), 1e3 * total.seconds / total.calls,
                    total.seconds > 0 ? 100.0 * total.wait_seconds / total.seconds : 0.0);
      line += part;
    }
    if (lead_ && !line.empty())
      std::printf("Communication of device 0 by mesh axes: %s\n", line.c_str());
  }

  static train::CheckpointLayout layout(const detail::Loop& loop) {
    if (loop.ctx == nullptr) return {};
    return {loop.ctx, &loop.composed->specs(), &loop.composed->strategy()};
  }

  bool restore() {
    const auto pos = ckpt_.restore(state_);
    if (!pos) return false;
    if (loop_.loader != nullptr) loop_.loader->seek({pos->epoch, pos->batch});
    if (lead_) {
      std::printf("Resumed from %s at step %lld\n", ckpt_.config().dir.c_str(),
                  static_cast<long long>(state_.step));
      warn_if_schedule_changed();
    }
    return true;
  }

  // The learning-rate schedule spans the run (warmup, then cosine decay to run.steps): a
  // resume with other steps or optimizer settings than the checkpoint's run changes the
  // rate from here on. Allowed, but said, with the rate at this step before and after.
  void warn_if_schedule_changed() const {
    const config::TrainConfig& now = *loop_.config;
    config::TrainConfig then;
    try {
      const auto saved = nlohmann::json::parse(ckpt_.restored_config());
      if (!saved.contains("toml")) return;  // a checkpoint that recorded no config
      config::apply_toml(then, saved["toml"].get<std::string>(), "the checkpoint's config");
    } catch (const std::exception&) {
      return;  // written by another version: nothing to compare with
    }
    std::string changed;
    const auto differs = [&](const char* key, double a, double b) {
      if (a == b) return;
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s%s %g -> %g", changed.empty() ? "" : ", ", key, a, b);
      changed += buf;
    };
    differs("run.steps", double(then.run.steps), double(now.run.steps));
    differs("run.epochs", double(then.run.epochs), double(now.run.epochs));
    differs("optimizer.lr", then.optimizer.lr, now.optimizer.lr);
    differs("optimizer.warmup_steps", double(then.optimizer.warmup_steps),
            double(now.optimizer.warmup_steps));
    differs("optimizer.final_lr_ratio", then.optimizer.final_lr_ratio,
            now.optimizer.final_lr_ratio);
    if (changed.empty()) return;
    const double lr_now = loop_.optimizer->learning_rate(state_.step);
    std::string before;
    if (then.run.steps > 0 && loop_.total_steps == now.run.steps) {  // a schedule over run.steps
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.3g -> ",
                    make_adamw(then, then.run.steps).learning_rate(state_.step));
      before = buf;
    }
    std::printf("Warning: the checkpoint's run had other schedule settings (%s): the learning "
                "rate from step %lld follows this run's schedule (%s%.3g at this step)\n",
                changed.c_str(), static_cast<long long>(state_.step), before.c_str(), lr_now);
  }

  // A resumed run whose checkpoint is at or past the last step: nothing trains and no file
  // changes (metrics.jsonl, summary.json, the checkpoints); the restored parameters are
  // evaluated for the program's closing lines, without a log record.
  RunResult already_finished(RunResult result) {
    result.already_finished = true;
    result.checkpoint = train::find_checkpoint(ckpt_.config().dir).value_or("");
    if (lead_)
      std::printf("Nothing to train: the checkpoint is at step %lld and the run ends at step %lld "
                  "(raise run.steps to train further); %s is as the run left it\n",
                  static_cast<long long>(state_.step), static_cast<long long>(loop_.total_steps),
                  loop_.config->run.out_dir.c_str());
    if (!loop_.eval_batches.empty())
      result.eval = loop_.composed->evaluate(state_.params, eval_batches_here());
    return result;
  }

  // The evaluation batches on this device (its share of their sequences under context
  // parallelism): the program may have made them on another thread's device (e.g. the host);
  // no copy when they are here already.
  std::vector<train::Batch> eval_batches_here() const {
    std::vector<train::Batch> batches;
    for (const train::Batch& b : loop_.eval_batches)
      batches.push_back(loop_.composed->local_batch(
          b.map([](const tensor::Tensor& t) { return t.to(current_device()); })));
    return batches;
  }

  train::DataPosition position() const {
    if (loop_.loader == nullptr) return {0, state_.step};
    return {loop_.loader->position().epoch, loop_.loader->position().batch};
  }

  train::TrainerConfig trainer_config(bool resumed) const {
    const int device = loop_.ctx != nullptr ? loop_.ctx->device() : 0;
    train::TrainerConfig t;
    t.out_dir = lead_ ? loop_.config->run.out_dir : std::string();
    t.total_steps = loop_.total_steps;
    t.log_every = loop_.log_every;
    // A device's example is its share of each sequence under context parallelism (the
    // trainer multiplies by the devices that average: data x context).
    t.items_per_example =
        loop_.items_per_example / loop_.composed->context_plan().layout.size;
    t.items_name = loop_.items_name;
    t.mesh = loop_.ctx != nullptr ? loop_.ctx->mesh().describe() : std::string("single device");
    t.backend = loop_.ctx != nullptr ? backend_label(*loop_.config) : std::string("none");
    t.print = lead_;
    // Under a launcher (mpirun, srun) a rank's stdout is the launcher's pipe or pty, whatever
    // the user's own output is (often a file): the log lines only, no bar redrawn in place.
    t.progress_bar = comm::discover_launch_environment().launcher == comm::Launcher::None;
    t.append = resumed;
    // A pipeline's timeline is the spans of its actions (the program writes it).
    if (loop_.composed->pipeline() == nullptr) t.timeline_file = timeline_file(*loop_.config, device);
    t.device = device;
    return t;
  }

  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // The batch of the step about to run, on this device (its share of the sequences under
  // context parallelism): made ahead on the host thread or now. A batch made on the host is
  // copied here (on the CPU too, so that it counts in this device's memory); the time it
  // took is the step's wait for data.
  train::Batch next_batch() {
    const auto t0 = std::chrono::steady_clock::now();
    train::Batch b = ahead_ ? ahead_->next(state_.step) : loop_.batch(state_.step);
    if (ahead_) {
      const Device here = current_device();
      const auto move = [&](const tensor::Tensor& t) {
        return t.device() == here ? t.clone() : t.to(here);
      };
      b = b.map(move);
    }
    b = loop_.composed->local_batch(b);  // this device's positions under context parallelism
    data_wait_s_ += seconds_since(t0);
    return b;
  }

  void step(train::Trainer& trainer) {
    const train::Batch batch = next_batch();
    // The last step's timeline is measured: the stages start it together.
    if (loop_.composed->pipeline() != nullptr && state_.step + 1 == loop_.total_steps) {
      loop_.ctx->comm(mesh::Axes("pipe")).barrier();
      loop_.composed->pipeline()->time_on_device(true);  // a GPU's time, for this step only
    }
    const train::Metrics m = trainer.step(state_, batch);
    if (const Network& net = loop_.composed->network(); net.after_update)
      net.after_update(state_.params, m);
  }

  train::Metrics evaluate(train::Trainer& trainer) {
    if (loop_.eval_batches.empty()) return {};
    const train::Metrics eval = loop_.composed->evaluate(state_.params, eval_batches_here());
    trainer.log_eval(state_.step, eval);
    return eval;
  }

  const detail::Loop& loop_;
  train::TrainState& state_;
  bool lead_;
  train::Checkpointer ckpt_;
  std::unique_ptr<data::Prefetcher> ahead_;
  double data_wait_s_ = 0;  // in next_batch
};

}  // namespace

namespace detail {

RunResult run_loop(const Loop& loop) { return DeviceRun(loop).run(); }

}  // namespace detail

optim::AdamW make_adamw(const config::TrainConfig& c, std::int64_t total_steps) {
  const double lr = c.optimizer.lr;
  return optim::AdamW({.learning_rate = optim::warmup_cosine_schedule(
                           0.0, lr, std::min<std::int64_t>(c.optimizer.warmup_steps, total_steps - 1),
                           total_steps, lr * c.optimizer.final_lr_ratio),
                       .b1 = c.optimizer.b1,
                       .b2 = c.optimizer.b2,
                       .eps = c.optimizer.eps,
                       .weight_decay = c.optimizer.weight_decay,
                       .decay_mask = optim::default_decay_mask()});
}

namespace {
std::atomic<bool> g_stop{false};  // lock-free: set from a signal handler
static_assert(std::atomic<bool>::is_always_lock_free);
}  // namespace

void request_stop() {
  g_stop.store(true, std::memory_order_relaxed);
}
bool stop_requested() {
  return g_stop.load(std::memory_order_relaxed);
}
void clear_stop_request() {
  g_stop.store(false, std::memory_order_relaxed);
}

train::CheckpointConfig checkpoint_config(const config::TrainConfig& c) {
  train::CheckpointConfig out;
  if (c.run.out_dir.empty()) return out;
  // The directory is always given, so that a fresh run that saves nothing still refuses
  // (or with run.overwrite removes) the checkpoints of an earlier run there.
  out.dir = (std::filesystem::path(c.run.out_dir) / "checkpoints").string();
  out.every = c.run.checkpoint_every;
  out.keep_last = 2;
  out.resume = resume_of(c.run.resume);
  out.overwrite = c.run.overwrite;
  out.drop = c.run.resume_drop;
  out.saves = c.run.checkpoint_every > 0 || c.run.resume != config::Resume::Off;
  out.config = nlohmann::json{{"toml", config::to_toml(c)}}.dump();
  return out;
}

std::string timeline_file(const config::TrainConfig& c, int device) {
  if (!c.run.timeline || c.run.out_dir.empty()) return "";
  return (std::filesystem::path(c.run.out_dir) / ("timeline_device" + std::to_string(device) + ".json"))
      .string();
}

std::string backend_label(const config::TrainConfig& c) {
  return comm::backend_name(c.distributed.comm_backend());
}

train::Batch replica_slice(const train::Batch& batch, int replica, int replicas) {
  const std::int64_t per = batch.size() / replicas;
  return batch.slice(replica * per, (replica + 1) * per);
}

}  // namespace distjax::app
