#include "distjax/train/checkpointer.hpp"

#include "distjax/core/error.hpp"
#include "distjax/spmd/device_context.hpp"

namespace distjax::train {

Checkpointer::Checkpointer(CheckpointConfig config, CheckpointLayout layout)
    : config_(std::move(config)), layout_(layout) {
  DISTJAX_CHECK(config_.every >= 0, InvalidArgument, "[Checkpointer] every must be >= 0, got ",
                config_.every);
}

std::optional<DataPosition> Checkpointer::restore(TrainState& state) {
  if (config_.dir.empty() || !config_.resume) return std::nullopt;
  // Every device looks; they must agree (they do on a file system all of them share),
  // since a load is collective.
  std::int32_t found = find_checkpoint(config_.dir).has_value() ? 1 : 0;
  if (layout_.ctx != nullptr) {
    comm::Communicator& world = layout_.ctx->world();
    std::int32_t finders = found;
    world.all_reduce(&finders, &finders, 1, DType::I32, comm::ReduceOp::Sum);
    DISTJAX_CHECK(finders == 0 || finders == world.size(), IoError, "[Checkpointer] ", finders,
                  " of ", world.size(), " devices find a checkpoint in \"", config_.dir,
                  "\" (is it on a file system every process shares?); this device ",
                  found ? "does" : "does not");
  }
  if (found == 0) return std::nullopt;
  const CheckpointMeta meta = load_checkpoint(config_.dir, state, layout_);
  last_saved_step_ = meta.step;
  return meta.data;
}

bool Checkpointer::maybe_save(const TrainState& state, DataPosition data) {
  if (config_.dir.empty() || config_.every <= 0 || state.step % config_.every != 0) return false;
  return !save(state, data).empty();
}

std::string Checkpointer::save(const TrainState& state, DataPosition data) {
  if (config_.dir.empty() || state.step == last_saved_step_) return {};
  std::string out = save_checkpoint(config_.dir, state, layout_,
                                    {.data = data,
                                     .config = config_.config,
                                     .keep_last = config_.keep_last,
                                     .fault_hook = config_.fault_hook});
  last_saved_step_ = state.step;
  return out;
}

}  // namespace distjax::train
