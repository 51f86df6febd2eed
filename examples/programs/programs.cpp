// The registry of training programs, their defaults (the example binaries' flag
// defaults; configs/<example>.toml say the same) and run_program.
#include "programs/programs.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "distjax/comm/launch_environment.hpp"
#include "distjax/config/config_file.hpp"
#include "distjax/core/error.hpp"

namespace distjax::examples {
namespace {

void defaults_train_mnist(config::TrainConfig& c) {
  c.run.program = "train_mnist";
  c.run.steps = 0;
  c.run.epochs = 10;
  c.run.batch_size = 128;
  c.run.log_every = 100;
  c.run.out_dir = "runs/mnist";
  c.run.seed = 0;
  c.model.hidden = 512;
  c.model.dropout = 0.1;
  c.optimizer.lr = 2e-3;
  c.optimizer.final_lr_ratio = 0.01;
  c.optimizer.warmup_steps = 200;
  c.optimizer.weight_decay = 1e-4;
  c.distributed.world_size = 2;
}

void defaults_data_parallelism(config::TrainConfig& c) {
  c.run.program = "data_parallelism";
  c.run.steps = 300;
  c.run.batch_size = 128;
  c.run.log_every = 50;
  c.run.out_dir = "runs/data_parallelism";
  c.run.seed = 69;  // the toolkit's seed
  c.model.hidden = 512;
  c.model.dropout = 0.1;
  c.optimizer.lr = 1e-3;
  c.optimizer.final_lr_ratio = 0.01;
  c.optimizer.warmup_steps = 20;
  c.optimizer.max_grad_norm = 1.0;
  c.parallelism.fsdp.modules = {"*"};
  c.parallelism.fsdp.min_weight_size = std::int64_t{1} << 18;
  c.distributed.world_size = 8;
}

void defaults_tensor_parallelism(config::TrainConfig& c) {
  c.run.program = "tensor_parallelism";
  c.run.steps = 300;
  c.run.batch_size = 128;
  c.run.log_every = 50;
  c.run.out_dir = "runs/tensor_parallelism";
  c.run.seed = 42;  // the toolkit's seed
  c.model.hidden = 512;
  c.model.layers = 3;
  c.model.dropout = 0.1;
  c.optimizer.lr = 1e-3;
  c.optimizer.final_lr_ratio = 0.01;
  c.optimizer.warmup_steps = 20;
  c.optimizer.max_grad_norm = 1.0;
  c.parallelism.tp_layout = "gather";
  c.distributed.world_size = 8;
  c.distributed.tensor_parallel_size = 4;
  c.distributed.mesh_shape = {2, 4};
  c.distributed.mesh_axis_names = {"data", "model"};
}

void defaults_gpt(config::TrainConfig& c) {
  c.run.program = "gpt";
  c.run.steps = 200;
  c.run.batch_size = 16;
  c.run.log_every = 20;
  c.run.eval_batches = 4;
  c.run.out_dir = "runs/gpt_mesh";
  c.run.seed = 0;
  c.model.layers = 4;
  c.model.d_model = 128;
  c.model.heads = 4;
  c.model.dropout = 0.0;
  c.data.seq_len = 64;
  c.optimizer.lr = 3e-3;
  c.optimizer.final_lr_ratio = 0.1;
  c.optimizer.warmup_steps = 20;
  c.optimizer.b2 = 0.95;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.max_grad_norm = 1.0;
  c.parallelism.tp_layout = "megatron";
  c.parallelism.fsdp.min_weight_size = std::int64_t{1} << 14;
  c.distributed.world_size = 8;
  c.distributed.tensor_parallel_size = 4;
  c.distributed.mesh_shape = {2, 4};
  c.distributed.mesh_axis_names = {"data", "model"};
}

void defaults_train_gpt(config::TrainConfig& c) {
  c.run.program = "train_gpt";
  c.run.steps = 600;
  c.run.batch_size = 16;
  c.run.log_every = 50;
  c.run.eval_every = 100;
  c.run.eval_batches = 8;
  c.run.out_dir = "runs/gpt";
  c.run.seed = 0;
  c.model.layers = 4;
  c.model.d_model = 128;
  c.model.heads = 4;
  c.model.dropout = 0.0;
  c.data.seq_len = 64;
  c.optimizer.lr = 3e-3;
  c.optimizer.final_lr_ratio = 0.1;
  c.optimizer.warmup_steps = 30;
  c.optimizer.b2 = 0.95;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.max_grad_norm = 1.0;
  c.distributed.enabled = false;
}

void defaults_pipeline_parallelism(config::TrainConfig& c) {
  c.run.program = "pipeline_parallelism";
  c.run.steps = 200;
  c.run.batch_size = 128;
  c.run.log_every = 20;
  c.run.out_dir = "runs/pipeline_parallelism";
  c.run.seed = 42;
  c.model.hidden = 256;
  c.model.layers = 8;
  c.model.dropout = 0.0;
  c.optimizer.lr = 1e-3;
  c.optimizer.final_lr_ratio = 0.01;
  c.optimizer.warmup_steps = 20;
  c.optimizer.max_grad_norm = 1.0;
  c.parallelism.schedule = "1f1b";
  c.parallelism.microbatches = 8;
  c.distributed.world_size = 8;
  c.distributed.pipeline_parallel_size = 4;
}

}  // namespace

const std::vector<ProgramInfo>& programs() {
  static const std::vector<ProgramInfo> list = {
      {"train_mnist",
       "the MLP classifier on Fashion-MNIST, data parallel over \"data\"",
       defaults_train_mnist,
       run_train_mnist,
       {},
       check_train_mnist},
      {"data_parallelism",
       "the MLP classifier on Fashion-MNIST with ZeRO-1/2 or FSDP",
       defaults_data_parallelism,
       run_data_parallelism,
       {.zero_stages = {0, 1, 2}, .fsdp = true},
       check_data_parallelism},
      {"tensor_parallelism",
       "the TP classifier on Fashion-MNIST over (data, model)",
       defaults_tensor_parallelism,
       run_tensor_parallelism,
       {.tensor_parallel = true},
       check_tensor_parallelism},
      {"gpt",
       "the GPT on the fortunes corpus over (data, model): TP layouts, FSDP, remat",
       defaults_gpt,
       run_gpt,
       // ZeRO-1/2: no; its data parallelism shards with FSDP (parallelism.fsdp.modules).
       {.tensor_parallel = true,
        .pipeline_parallel = true,
        .fsdp = true,
        .mixed_precision = true,
        .fp16_pipeline = true,
        .ties_embeddings = true},
       check_gpt},
      {"train_gpt",
       "the GPT on the fortunes corpus on one device",
       defaults_train_gpt,
       run_train_gpt,
       {.max_devices = 1, .mixed_precision = true},
       nullptr},
      {"pipeline_parallelism",
       "the pipeline-parallel MLP classifier on Fashion-MNIST over (data, pipe)",
       defaults_pipeline_parallelism,
       run_pipeline_parallelism,
       {.pipeline_parallel = true},
       check_pipeline_parallelism},
  };
  return list;
}

const ProgramInfo& find_program(const std::string& name) {
  std::vector<std::string> names;
  for (const ProgramInfo& p : programs()) {
    if (name == p.name) return p;
    names.emplace_back(p.name);
  }
  std::string msg = "[config] run.program = \"" + name + "\" is not a program";
  if (const std::string near = config::nearest_name(name, names); !near.empty())
    msg += "; did you mean \"" + near + "\"?";
  msg += " (programs:";
  for (const std::string& n : names)
    msg += " " + n;
  throw ConfigError(msg + ")");
}

config::TrainConfig program_defaults(const std::string& name) {
  config::TrainConfig c;
  find_program(name).defaults(c);
  return c;
}

nn::Precision precision_of(const config::TrainConfig& c) {
  switch (c.distributed.mixed_precision) {
    case config::MixedPrecision::Bf16:
      return nn::Precision::bf16();
    case config::MixedPrecision::Fp16:
      return nn::Precision::fp16();
    case config::MixedPrecision::No:
      break;
  }
  return nn::Precision::f32();
}

void enable_loss_scale(const config::TrainConfig& c, train::TrainState& state) {
  if (c.distributed.mixed_precision == config::MixedPrecision::Fp16)
    state.loss_scale = train::DynamicLossScale{};
}

std::string backend_label(const config::TrainConfig& c) {
  return comm::backend_name(c.distributed.comm_backend());
}

config::TrainConfig prepare_program(config::TrainConfig c, const std::string& source) {
  find_program(c.run.program);
  c.distributed = config::resolve(c.distributed, comm::discover_launch_environment());
  c.validate(source);
  DISTJAX_CHECK(c.run.steps > 0 || c.run.program == "train_mnist", ConfigError, "[", c.run.program,
                "] needs run.steps > 0 (run.epochs is train_mnist's)");
  check_program(c);
  make_out_dir(c);
  train::check_restore(checkpoint_config(c));
  return c;
}

void check_program(const config::TrainConfig& c) {
  const ProgramInfo& program = find_program(c.run.program);
  std::string refused;
  for (const std::string& p : program.capabilities.problems(c))
    refused += (refused.empty() ? "[" : "\n[") + c.run.program + "] " + p;
  DISTJAX_CHECK(refused.empty(), NotImplemented, refused);
  if (program.check != nullptr) program.check(c);
}

void make_out_dir(const config::TrainConfig& c) {
  const std::string& dir = c.run.out_dir;
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DISTJAX_CHECK(!ec, ConfigError, "[config] run.out_dir = \"", dir,
                "\": cannot create the directory: ", ec.message());
  // Writable: a probe file made and removed (permission bits alone miss read-only mounts).
  std::string probe = (std::filesystem::path(dir) / ".distjax_probe_XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  DISTJAX_CHECK(fd >= 0, ConfigError, "[config] run.out_dir = \"", dir,
                "\": cannot write in the directory: ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

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

RunCheckpoints::RunCheckpoints(const config::TrainConfig& c, train::CheckpointLayout layout,
                               train::TrainState& state, data::DataLoader& loader, bool lead)
    : ckpt_(checkpoint_config(c), layout), loader_(&loader), lead_(lead) {
  if (const auto pos = ckpt_.restore(state)) {
    resumed_ = true;
    loader_->seek({pos->epoch, pos->batch});
    if (lead_)
      std::printf("Resumed from %s at step %lld\n", ckpt_.config().dir.c_str(),
                  static_cast<long long>(state.step));
  }
}

void RunCheckpoints::after_step(const train::TrainState& state) {
  ckpt_.maybe_save(state, {loader_->position().epoch, loader_->position().batch});
}

void RunCheckpoints::finish(const train::TrainState& state) {
  const std::string saved =
      ckpt_.save(state, {loader_->position().epoch, loader_->position().batch});
  if (lead_ && ckpt_.config().saves)
    std::printf("Checkpoint: %s\n", train::find_checkpoint(ckpt_.config().dir).value_or(saved).c_str());
}

std::string timeline_file(const config::TrainConfig& c, int device) {
  if (!c.run.timeline || c.run.out_dir.empty()) return "";
  return (std::filesystem::path(c.run.out_dir) / ("timeline_device" + std::to_string(device) + ".json"))
      .string();
}

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

}  // namespace

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

int run_program(config::TrainConfig c, const std::string& source) {
  c = prepare_program(std::move(c), source);
  return find_program(c.run.program).run(c);
}

}  // namespace distjax::examples
