#include "distjax/train/checkpointer.hpp"

#include <cstdio>
#include <filesystem>

#include "distjax/core/error.hpp"
#include "distjax/spmd/device_context.hpp"

namespace distjax::train {

namespace fs = std::filesystem;

namespace {

// Why `dir` holds no checkpoint: it does not exist, holds no step directory, or its step
// directories have no index.json (saves cut short, or damage), named.
std::string why_none(const std::string& dir) {
  if (!fs::is_directory(dir)) return "the directory does not exist";
  std::string incomplete;
  int count = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0 && !fs::exists(e.path() / "index.json"))
      incomplete += (count++ ? ", " : "") + name;
  }
  if (count == 0) return "it holds no step_<n> directory";
  return incomplete + (count == 1 ? " has" : " have") +
         " no index.json (a save cut short, or damage)";
}

// "step N" for a step directory step_<N>, else its path.
std::string step_text(const std::string& step_dir) {
  long long step = 0;
  const std::string name = fs::path(step_dir).filename().string();
  if (std::sscanf(name.c_str(), "step_%lld", &step) == 1) return "step " + std::to_string(step);
  return "\"" + step_dir + "\"";
}

// What restore() refuses, given the checkpoint of config.dir it found (if any): a fresh run
// over checkpoints without overwrite, and a required resume without a checkpoint.
void check_found(const CheckpointConfig& config, const std::optional<std::string>& found) {
  DISTJAX_CHECK(config.resume != Resume::Off || !found || config.overwrite, ConfigError,
                "[Checkpointer] \"", config.dir, "\" holds checkpoints up to ",
                step_text(found.value_or("")),
                ": pass --resume to continue, --resume=auto, or --overwrite to start afresh "
                "(run.resume, run.overwrite)");
  DISTJAX_CHECK(config.resume != Resume::Required || found, ConfigError,
                "[Checkpointer] no checkpoint to resume from in \"", config.dir,
                "\": ", why_none(config.dir),
                ". Start afresh without --resume (run.resume = false), or pass --resume=auto "
                "(run.resume = \"auto\") to resume only when there is a checkpoint");
}

}  // namespace

void check_restore(const CheckpointConfig& config) {
  if (!config.dir.empty()) check_found(config, find_checkpoint(config.dir));
}

Checkpointer::Checkpointer(CheckpointConfig config, CheckpointLayout layout)
    : config_(std::move(config)), layout_(layout) {
  DISTJAX_CHECK(config_.every >= 0, InvalidArgument, "[Checkpointer] every must be >= 0, got ",
                config_.every);
}

std::optional<std::string> Checkpointer::find_agreed() const {
  // Every device looks; they must agree (they do on a file system all of them share),
  // since what follows is collective.
  const std::optional<std::string> found = find_checkpoint(config_.dir);
  if (layout_.ctx != nullptr) {
    comm::Communicator& world = layout_.ctx->world();
    std::int32_t finders = found ? 1 : 0;
    world.all_reduce(&finders, &finders, 1, DType::I32, comm::ReduceOp::Sum);
    DISTJAX_CHECK(finders == 0 || finders == world.size(), IoError, "[Checkpointer] ", finders,
                  " of ", world.size(), " devices find a checkpoint in \"", config_.dir,
                  "\" (is it on a file system every process shares?); this device ",
                  found ? "does" : "does not");
  }
  return found;
}

std::optional<DataPosition> Checkpointer::restore(TrainState& state) {
  if (config_.dir.empty()) return std::nullopt;
  const std::optional<std::string> found = find_agreed();
  check_found(config_, found);  // the devices agree on `found`: all throw, or none
  if (!found) return std::nullopt;
  if (config_.resume == Resume::Off) {  // with overwrite
    remove_checkpoints(config_.dir, layout_);
    return std::nullopt;
  }
  const CheckpointMeta meta = load_checkpoint(*found, state, layout_, {.drop = config_.drop});
  last_saved_step_ = meta.step;
  restored_config_ = meta.config;
  return meta.data;
}

bool Checkpointer::maybe_save(const TrainState& state, DataPosition data) {
  if (!due(state)) return false;
  return !save(state, data).empty();
}

std::string Checkpointer::save(const TrainState& state, DataPosition data) {
  if (config_.dir.empty() || !config_.saves || state.step == last_saved_step_) return {};
  std::string out = save_checkpoint(config_.dir, state, layout_,
                                    {.data = data,
                                     .config = config_.config,
                                     .keep_last = config_.keep_last,
                                     .fault_hook = config_.fault_hook});
  last_saved_step_ = state.step;
  return out;
}

}  // namespace distjax::train
