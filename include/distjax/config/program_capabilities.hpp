// ProgramCapabilities: what a training program runs of the parallelism a config can ask
// for (mesh axes, ZeRO, FSDP, precision). A program refuses a config that asks for more
// before it runs, and `distjax plan` suggests only setups within it.
#pragma once

#include <string>
#include <vector>

#include "distjax/config/train_config.hpp"

namespace distjax::config {

/// What a program runs; every other choice of these keys is refused, none ignored.
///
///   ProgramCapabilities gpt{.tensor_parallel = true, .pipeline_parallel = true,
///                           .shards = {Shard::None, Shard::Parameters},
///                           .mixed_precision = true};
///   gpt.problems(config);   // {"parallelism.shard = \"optimizer\": ..."} for ZeRO-1
struct ProgramCapabilities {
  int max_devices = 0;             ///< devices it runs on at most; 0: any number
  bool tensor_parallel = false;    ///< a "model" axis (distributed.tensor_parallel_size > 1)
  bool pipeline_parallel = false;  ///< a "pipe" axis (distributed.pipeline_parallel_size > 1)
  /// a "context" axis (distributed.context_parallel_size > 1): a model with attention whose
  /// sequence splits
  bool context_parallel = false;
  /// an "expert" axis (distributed.expert_parallel_size > 1): a model with Mixture-of-Experts
  /// layers whose experts split
  bool expert_parallel = false;
  /// parallelism.shard values it runs over "data" (none: plain data parallelism).
  std::vector<Shard> shards = {Shard::None};
  bool mixed_precision = false;  ///< distributed.mixed_precision "bf16" and "fp16"
  /// "fp16" with a "pipe" axis: the program gives its pipeline the train step's loss
  /// function (parallel::Pipeline::module_loss()), which the loss scale scales.
  bool fp16_pipeline = false;
  /// Reads model.tie_embeddings (the GPT): a tied model runs no pipeline, whose first and
  /// last stages cannot share the embedding.
  bool ties_embeddings = false;

  bool runs(Shard s) const;
  /// The capabilities left once a config's model and precision are chosen: "fp16"
  /// without fp16_pipeline runs no pipeline, nor does a tied model (ties_embeddings).
  ProgramCapabilities for_config(const TrainConfig& c) const;
  /// One message per key of `c` (resolved) that asks for what the program does not run,
  /// "distributed.pipeline_parallel_size = 2: no pipeline (runs: ...)"; empty when it runs.
  std::vector<std::string> problems(const TrainConfig& c) const;
  /// "mesh axes data, model, pipe; DP, FSDP; f32, bf16, fp16 (fp16 not with pipe)".
  std::string str() const;
};

}  // namespace distjax::config
