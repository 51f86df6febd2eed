#include "distjax/train/trainer.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/train/strategy.hpp"
#include "distjax/train/plot.hpp"

namespace distjax::train {

namespace {

// The means of the metrics that are shown: names starting with '_' are a model's own, read
// after the step (Metrics::at) and never logged (an MoE layer's per-expert loads).
std::map<std::string, double> public_means(const Metrics& m) {
  std::map<std::string, double> out = m.means();
  std::erase_if(out, [](const auto& kv) { return !kv.first.empty() && kv.first.front() == '_'; });
  return out;
}


// Steps whose values stay on the device before the Trainer reads them anyway (a host wait
// every so many steps when the logs are further apart).
constexpr std::size_t kMaxUncheckedSteps = 256;

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// JSON has no NaN/Inf: write them as null.
json number(double v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

std::string short_name(const std::string& name) {
  if (name == "learning_rate") return "lr";
  if (name == "grad_norm") return "gnorm";
  return name;
}

std::string format_value(const std::string& name, double v) {
  char buf[64];
  if (name == "learning_rate")
    std::snprintf(buf, sizeof buf, "%.3e", v);
  else if (std::fabs(v) >= 1e4 || (v != 0.0 && std::fabs(v) < 1e-3))
    std::snprintf(buf, sizeof buf, "%.3e", v);
  else
    std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

}  // namespace

struct Trainer::Files {
  std::filesystem::path dir;
  std::ofstream metrics;
};

Trainer::Trainer(TrainerConfig config, const optim::Optimizer& optimizer, LossFn loss_fn,
                 TrainStepOptions options)
    : config_(std::move(config)),
      optimizer_(optimizer),
      loss_fn_(std::move(loss_fn)),
      options_(options),
      start_(Clock::now()) {
  // A pipeline computes the loss in its last stage and needs none.
  DISTJAX_CHECK(loss_fn_ || options_.strategy, InvalidArgument,
                "[Trainer] loss function is empty (only a strategy that computes the loss "
                "itself, a pipeline, runs without one)");
  DISTJAX_CHECK(config_.log_every >= 1, InvalidArgument, "[Trainer] log_every must be >= 1, got ",
                config_.log_every);
  if (!config_.out_dir.empty()) {
    files_ = std::make_unique<Files>();
    files_->dir = config_.out_dir;
    std::error_code ec;
    std::filesystem::create_directories(files_->dir, ec);
    DISTJAX_CHECK(!ec, IoError, "[Trainer] cannot create output directory \"", config_.out_dir,
                  "\": ", ec.message());
  }
  tty_ = config_.print && config_.progress_bar && isatty(fileno(stdout)) != 0;
}

void Trainer::write_timeline() const {
  if (config_.timeline_file.empty() || spans_.empty()) return;
  const double t0 = spans_.front().start;
  json events = json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", config_.device},
                    {"args", {{"name", "device " + std::to_string(config_.device)}}}});
  auto event = [&](const char* name, const char* cat, double a, double b) {
    if (b <= a) return;
    events.push_back({{"name", name}, {"cat", cat}, {"ph", "X"}, {"ts", (a - t0) * 1e6},
                      {"dur", (b - a) * 1e6}, {"pid", config_.device}, {"tid", 0}});
  };
  double prev_end = t0;
  for (const StepSpans& s : spans_) {
    event("between steps", "idle", prev_end, s.start);
    event("forward + backward", "compute", s.start, s.forward_backward_end);
    if (s.update_streamed) {  // each bucket updated as it arrived: one phase
      event("gradient sync + update", "communication", s.forward_backward_end, s.update_end);
    } else {
      event("gradient sync", "communication", s.forward_backward_end, s.sync_end);
      event("update", "compute", s.sync_end, s.update_end);
    }
    prev_end = s.update_end;
  }
  const std::filesystem::path path(config_.timeline_file);
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream f(path);
  DISTJAX_CHECK(f.good(), IoError, "[Trainer] cannot write the timeline \"", path.string(), "\"");
  f << json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << '\n';
}

std::string Trainer::eta(std::int64_t step) const {
  if (config_.total_steps <= 0 || step <= first_step_ || train_seconds_ <= 0.0) return "";
  const double per_step = train_seconds_ / static_cast<double>(step - first_step_);
  const auto left = static_cast<long long>(per_step * static_cast<double>(config_.total_steps - step));
  char buf[32];
  if (left >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", left / 3600, left / 60 % 60);
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", left / 60, left % 60);
  return buf;
}

void Trainer::clear_progress() {
  if (!bar_shown_) return;
  std::printf("\r\033[K");
  bar_shown_ = false;
}

void Trainer::draw_progress(std::int64_t step, double loss) {
  // At most ten redraws a second; always the last step.
  const double now = elapsed_s();
  if (now - last_bar_ < 0.1 && step != config_.total_steps) return;
  last_bar_ = now;
  constexpr int kWidth = 24;
  const double frac = config_.total_steps > 0
                          ? std::min(1.0, static_cast<double>(step) / config_.total_steps)
                          : 0.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.append(static_cast<std::size_t>(kWidth - filled), '-');
  const double tput = throughput();
  char loss_text[48] = "";  // none before the first read of a device's loss
  if (!std::isnan(loss)) std::snprintf(loss_text, sizeof loss_text, " | loss %.4f", loss);
  char buf[256];
  std::snprintf(buf, sizeof buf, "\r\033[K[%s] %lld/%lld %3.0f%%%s | %.0f %s/s | ETA %s",
                bar.c_str(), static_cast<long long>(step),
                static_cast<long long>(config_.total_steps), 100.0 * frac, loss_text, tput,
                config_.items_name.c_str(), eta(step).c_str());
  std::fputs(buf, stdout);
  std::fflush(stdout);
  bar_shown_ = true;
}

Trainer::~Trainer() = default;

double Trainer::elapsed_s() const {
  return seconds_since(start_);
}

double Trainer::throughput() const {
  return train_seconds_ > 0.0 ? total_items_ / train_seconds_ : 0.0;
}

// Opens metrics.jsonl before the first record, at the step the run starts from. A resumed
// run (append) keeps the records up to `step` and drops the later ones, which an
// interrupted run wrote past its last checkpoint and this run writes again.
void Trainer::open_log(std::int64_t step) {
  if (log_open_ || !files_) return;
  log_open_ = true;
  const auto path = files_->dir / "metrics.jsonl";
  if (config_.append && std::filesystem::exists(path)) {
    std::ifstream in(path);
    std::string kept, line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const json rec = json::parse(line, nullptr, /*allow_exceptions=*/false);
      // A line cut short by the kill does not parse: it is dropped with the later ones.
      if (rec.is_discarded() || !rec.contains("step") || !rec["step"].is_number_integer() ||
          rec["step"].get<std::int64_t>() > step)
        continue;
      kept += line + '\n';
    }
    const auto tmp = files_->dir / "metrics.jsonl.tmp";
    {
      std::ofstream out(tmp, std::ios::out | std::ios::trunc);
      out << kept;
      DISTJAX_CHECK(out.good(), IoError, "[Trainer] cannot write \"", tmp.string(), "\"");
    }
    std::filesystem::rename(tmp, path);
  }
  files_->metrics.open(path, std::ios::out | (config_.append ? std::ios::app : std::ios::trunc));
  DISTJAX_CHECK(files_->metrics.good(), IoError, "[Trainer] cannot write \"", path.string(), "\"");
}

void Trainer::write_record(const std::string& json_line) {
  if (!files_) return;
  files_->metrics << json_line << '\n';
  files_->metrics.flush();
}

Metrics Trainer::step(TrainState& state, const Batch& batch) {
  if (first_step_ < 0) first_step_ = state.step;
  open_log(state.step);
  const auto t0 = Clock::now();
  StepSpans spans;
  TrainStepOptions options = options_;
  // Spans only where the timeline keeps them: on a GPU each boundary waits for the device.
  const std::int64_t kept = std::max<std::int64_t>(1, config_.timeline_steps);
  if (!config_.timeline_file.empty() &&
      (config_.total_steps <= 0 || state.step >= config_.total_steps - kept))
    options.spans = &spans;
  const DeviceKind kind = current_device().kind;
  const std::int64_t waits = tensor::host_waits(kind);
  Metrics m = train_step(state, batch, loss_fn_, optimizer_, options);
  step_waits_ += tensor::host_waits(kind) - waits;
  if (options.spans) {
    spans_.push_back(spans);
    while (static_cast<std::int64_t>(spans_.size()) > std::max<std::int64_t>(1, config_.timeline_steps))
      spans_.pop_front();
  }
  const double dt = seconds_since(t0);
  // Each data-parallel replica sees its slice of the global batch.
  const int replicas = options_.strategy ? options_.strategy->data_parallel_size() : 1;
  const double items = static_cast<double>(batch.size()) * config_.items_per_example * replicas;
  train_seconds_ += dt;
  window_seconds_ += dt;
  window_items_ += items;
  total_items_ += items;
  window_.merge(m);
  last_lr_ = m.contains("learning_rate") ? m.mean("learning_rate") : last_lr_;
  // Checked now when the host has the values; else with the next read, in step order.
  if (m.pending("loss") || m.pending("grad_norm") || !unchecked_.empty()) {
    unchecked_.push_back({state.step, m, state.loss_scale.has_value()});
    if (unchecked_.size() >= kMaxUncheckedSteps) check_finite();  // bounds what is kept
  } else {
    check_step(state.step, m, state.loss_scale.has_value());
  }
  if (state.step % config_.log_every == 0 || state.step == config_.total_steps)
    log_train(state.step);
  // The bar shows the step's loss when the host has it, else the last logged one.
  if (tty_ && m.contains("loss"))
    draw_progress(state.step, !m.pending("loss")        ? m.mean("loss")
                              : last_train_.count("loss") ? last_train_.at("loss")
                                                          : std::nan(""));
  return m;
}

void Trainer::check_step(std::int64_t step, const Metrics& m, bool loss_scaled) {
  // Both values are reduced over the mesh: every device stops at the same step.
  const double loss = m.contains("loss") ? m.mean("loss") : 0.0;
  const double norm = m.contains("grad_norm") ? m.mean("grad_norm") : 0.0;
  if (std::isfinite(loss) && (std::isfinite(norm) || loss_scaled)) return;
  unchecked_.clear();
  clear_progress();
  const double bad = std::isfinite(loss) ? norm : loss;
  DISTJAX_CHECK(false, NonFiniteError, "[Trainer] step ", step, ": the ",
                std::isfinite(loss) ? "gradient norm" : "loss", " is ",
                std::isnan(bad) ? "nan" : (bad > 0 ? "inf" : "-inf"),
                "; the run stops here (nothing after step ", step - 1,
                " is kept: its last checkpoint is the latest). Lower optimizer.lr, set "
                "optimizer.max_grad_norm, or look at the data of this step");
}

void Trainer::check_finite() {
  std::vector<Unchecked> steps;
  steps.swap(unchecked_);
  for (const Unchecked& u : steps) check_step(u.step, u.metrics, u.loss_scaled);
}

void Trainer::log_train(std::int64_t step) {
  check_finite();  // the window's values are read here anyway
  if (window_.empty()) return;
  const double tput = window_seconds_ > 0.0 ? window_items_ / window_seconds_ : 0.0;
  last_train_ = public_means(window_);
  // The rate of the logged step itself, not the window's average.
  if (last_train_.count("learning_rate")) last_train_["learning_rate"] = last_lr_;
  json rec;
  rec["step"] = step;
  for (const auto& [name, v] : last_train_)
    rec[name] = number(v);
  rec["throughput"] = number(tput);
  rec["throughput_unit"] = config_.items_name + "/s";
  rec["elapsed_s"] = elapsed_s();
  write_record(rec.dump());

  if (config_.print) {
    std::string line = "step ";
    line.append(std::to_string(step));
    if (config_.total_steps > 0) line.append("/").append(std::to_string(config_.total_steps));
    // loss first, then lr and the rest in name order.
    auto emit = [&](const std::string& name) {
      line += " | " + short_name(name) + " " + format_value(name, last_train_.at(name));
    };
    if (last_train_.count("loss")) emit("loss");
    for (const auto& [name, _] : last_train_)
      if (name != "loss") emit(name);
    char buf[96];
    std::snprintf(buf, sizeof buf, " | %.0f %s/s | %.1fs", tput, config_.items_name.c_str(),
                  elapsed_s());
    line += buf;
    if (const std::string left = eta(step); !left.empty() && step < config_.total_steps)
      line += " | ETA " + left;
    clear_progress();
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  window_.clear();
  window_seconds_ = 0.0;
  window_items_ = 0.0;
}

Metrics Trainer::evaluate(const TrainState& state, const std::vector<Batch>& batches,
                          const LossFn& eval_fn) {
  DISTJAX_CHECK(eval_fn || loss_fn_, InvalidArgument,
                "[Trainer::evaluate] no loss function to evaluate with: pass eval_fn (a "
                "pipeline evaluates with parallel::Pipeline::evaluate and log_eval)");
  Metrics m = train::evaluate(state.params, batches, eval_fn ? eval_fn : loss_fn_,
                              state.rng.fold_in(std::string_view("eval")));
  if (options_.strategy) m = options_.strategy->reduce_metrics(std::move(m));
  log_eval(state.step, m);
  return m;
}

void Trainer::log_eval(std::int64_t step, const Metrics& eval) {
  open_log(step);
  last_eval_ = public_means(eval);
  json rec;
  rec["step"] = step;
  for (const auto& [name, v] : last_eval_)
    rec["eval_" + name] = number(v);
  rec["elapsed_s"] = elapsed_s();
  write_record(rec.dump());
  if (config_.print) {
    std::string line = "eval @ step " + std::to_string(step);
    for (const auto& [name, v] : last_eval_)
      line += " | " + name + " " + format_value(name, v);
    clear_progress();
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

void Trainer::finish(const TrainState& state, const std::map<std::string, double>& extra) {
  open_log(state.step);
  log_train(state.step);  // flush a partial window
  const double wall = elapsed_s();
  json s;
  s["steps"] = state.step;
  s["wall_time_s"] = wall;
  s["train_time_s"] = train_seconds_;
  s["throughput"] = number(throughput());
  s["throughput_unit"] = config_.items_name + "/s";
  s[config_.items_name + "_seen"] = total_items_;
  s["optimizer"] = optimizer_.name();
  // This device's; a caller that knows the whole model's count passes it in `extra`.
  s["num_parameters"] = state.params.num_elements();
  s["num_parameters_on_device"] = state.params.num_elements();
  s["mesh"] = config_.mesh;
  s["backend"] = config_.backend;
  s["host_waits_in_steps"] = step_waits_;
  json fm = json::object();
  for (const auto& [name, v] : last_train_)
    fm["train_" + name] = number(v);
  for (const auto& [name, v] : last_eval_)
    fm["eval_" + name] = number(v);
  s["final_metrics"] = fm;
  for (const auto& [name, v] : extra)  // whole numbers (counts) as integers
    s[name] = std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 9.0e15
                  ? json(static_cast<std::int64_t>(v))
                  : number(v);
  const MemoryStats* memory = options_.strategy ? options_.strategy->memory_stats() : nullptr;
  if (memory != nullptr)
    s["memory_bytes_per_device"] = {{"parameters", memory->parameters},
                                    {"gradients", memory->gradients},
                                    {"optimizer_state", memory->optimizer_state},
                                    {"activations_peak", memory->activations_peak}};
  // A GPU's memory: what tensors held (now, at the peak) and what the backend's pool holds.
  const Device device = current_device();
  s["device"] = device.str();
  std::string gpu_memory;
  if (device.kind == DeviceKind::CUDA) {
    const tensor::CudaMemoryStats pool = tensor::cuda_memory_stats(device.index);
    const std::int64_t peak = tensor::peak_bytes(DeviceKind::CUDA);
    s["device_memory_bytes"] = {{"allocated", tensor::live_bytes(DeviceKind::CUDA)},
                                {"allocated_peak", peak},
                                {"reserved", pool.reserved},
                                {"reserved_peak", pool.reserved_peak}};
    char line[160];
    std::snprintf(line, sizeof line, "%s memory: peak %.2f GiB allocated, %.2f GiB reserved",
                  device.str().c_str(), static_cast<double>(peak) / (1 << 30),
                  static_cast<double>(pool.reserved_peak) / (1 << 30));
    gpu_memory = line;
  }
  if (files_) {
    const auto path = files_->dir / "summary.json";
    const auto tmp = files_->dir / "summary.json.tmp";
    {
      std::ofstream f(tmp, std::ios::out | std::ios::trunc);
      DISTJAX_CHECK(f.good(), IoError, "[Trainer::finish] cannot write \"", tmp.string(), "\"");
      f << s.dump(2) << '\n';
    }
    std::filesystem::rename(tmp, path);
  }
  write_timeline();
  std::string plot_note;
  if (files_ && config_.plot) {
    files_->metrics.flush();
    const auto png = files_->dir / "loss_curve.png";
    const std::string why = plot_loss_curve(files_->dir / "metrics.jsonl", png, config_.mesh);
    plot_note = why.empty() ? ", " + png.string() : " (no loss curve: " + why + ")";
  }
  if (config_.print) {
    clear_progress();
    std::printf("done: %lld steps in %.1fs (%.0f %s/s)%s%s%s\n", static_cast<long long>(state.step),
                wall, throughput(), config_.items_name.c_str(), files_ ? ", wrote " : "",
                files_ ? (files_->dir / "summary.json").string().c_str() : "", plot_note.c_str());
    if (memory != nullptr) std::printf("memory of this device: %s\n", memory->str().c_str());
    if (!gpu_memory.empty()) std::printf("%s\n", gpu_memory.c_str());
    std::fflush(stdout);
  }
}

}  // namespace distjax::train
