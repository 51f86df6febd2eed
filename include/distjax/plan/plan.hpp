// Plan: the per-device memory and communication a training setup needs, predicted without
// running it (or allocating anything), and the meshes that fit a memory budget.
// `plan` is its own part, after `config` (it reads a TrainConfig and a program's
// capabilities) and beside `models` (whose parameter shapes it counts analytically, so that
// a 175B model costs nothing); it runs the pipeline schedules of parallel/pipeline_schedule.hpp
// (pure data) over its memory model. It is a tool's model of the library, not a layer the
// training path uses.
//
// Shape legend: b micro-batch (sequences per device per pass), s sequence (T), h width (C),
// a heads, L layers, V vocabulary; mesh axes data (d), model (t), pipe (p).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distjax/config/program_capabilities.hpp"
#include "distjax/config/train_config.hpp"
#include "distjax/plan/setup.hpp"

namespace distjax::plan {

/// Bytes sent per step by one device for one kind of collective over one mesh axis.
struct CommEntry {
  std::string axis;  ///< "data", "model", "pipe", "expert", "data,context"...
  std::string kind;  ///< "all_reduce", "all_gather", "reduce_scatter", "send"
  std::int64_t calls = 0;
  double bytes = 0;  ///< ring figures (comm::OpCounters's convention)
  std::string what;  ///< "gradients", "parameters (FSDP gather)", "activations (Megatron)"
};

/// Per-device prediction. Memory as spmd::DeviceContext::memory() measures it: parameters,
/// gradients and optimizer state by storage after the update; the activation peak is the
/// most bytes the forward and backward pass held beyond the state (saved activations, the
/// gradients the backward returns and the buffers they fill, FSDP's gathered weights, a
/// pipeline's gradient accumulator and posted receives).
struct Plan {
  Setup setup;
  int stage = 0;  ///< the pipeline stage reported: the one whose total is largest
  std::string model_name;
  std::int64_t model_params = 0;  ///< whole model
  double params_per_device = 0;   ///< elements on the busiest device
  double parameters = 0, gradients = 0, optimizer_state = 0, activations = 0;  ///< bytes
  double total() const { return parameters + gradients + optimizer_state + activations; }
  std::vector<CommEntry> comm;
  double comm_bytes() const;
  /// Text: the per-device table and the communication per step.
  std::string str() const;
};

/// The prediction for `model` under `setup`, on the device that holds the most (of a
/// pipeline: the stage with the largest total; the activation peak of each stage comes
/// from running its schedule, parallel::make_schedule, over the model of what each
/// forward keeps and each backward allocates). Throws InvalidArgument when the mesh does
/// not divide the model (layers over pipe x virtual stages, heads over model, the
/// sequence over model with sequence parallelism).
Plan make_plan(const ModelDescription& model, const Setup& setup);

/// The model and setup a config describes (run.program picks the model: gpt
/// -> describe_gpt, with its [model.moe] layers; classifier -> describe_classifier;
/// NotImplemented for another program). Activations use activation_model_distjax() in f32,
/// activation_model_megatron() in fp16 / bf16.
ModelDescription model_from_config(const config::TrainConfig& c);
Setup setup_from_config(const config::TrainConfig& c);
/// parallelism.shard of a setup (fsdp: "parameters"; else by zero_stage).
config::Shard shard_of(const Setup& s);

/// The config `c` with the choices meshes_that_fit makes taken from `s`: the mesh
/// (distributed.world_size, tensor_parallel_size, pipeline_parallel_size; an explicit
/// mesh_shape dropped for the default (data, model, pipe) axes, num_processes_per_node left
/// to config::resolve; enabled with more than one device), parallelism.shard (fsdp.modules
/// kept for "parameters", else cleared) and microbatches (1 without a pipe axis).
config::TrainConfig apply_setup(config::TrainConfig c, const Setup& s);

/// The (data, tensor, pipe) factorizations of `world` (tensor dividing the heads, pipe the
/// layers), each with plain data parallelism, ZeRO-1, ZeRO-2 and FSDP over "data", that
/// the program runs (`runs`: its mesh axes, ZeRO stages and FSDP; parallel::Pipeline takes
/// no ZeRO-2) and whose predicted total fits `budget_bytes`, smallest total first. A
/// pipeline gets at least p micro-batches. `base` gives everything else (batch, precision,
/// recompute...).
///
///   const auto& gpt = app::find_model("gpt").capabilities;   // DP, ZeRO-1/2, FSDP
///   meshes_that_fit(model, setup, 64, 80.0 * (1 << 30), gpt.for_config(config));
std::vector<Plan> meshes_that_fit(const ModelDescription& model, const Setup& base, int world,
                                  double budget_bytes, const config::ProgramCapabilities& runs);

/// "data=8 model=8 pipe=1 ZeRO-1"
std::string describe_setup(const Setup& s);

}  // namespace distjax::plan
