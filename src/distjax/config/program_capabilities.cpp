#include "distjax/config/program_capabilities.hpp"

#include <algorithm>
#include <sstream>

namespace distjax::config {

namespace {

std::string list(const std::vector<std::string>& names) {
  std::string out = "[";
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i ? ", \"" : "\"") + names[i] + "\"";
  return out + "]";
}

}  // namespace

bool ProgramCapabilities::runs(Shard s) const {
  return std::find(shards.begin(), shards.end(), s) != shards.end();
}

ProgramCapabilities ProgramCapabilities::for_config(const TrainConfig& c) const {
  ProgramCapabilities out = *this;
  if (c.distributed.mixed_precision == MixedPrecision::Fp16 && !fp16_pipeline)
    out.pipeline_parallel = false;
  if (ties_embeddings && c.model.tie_embeddings) out.pipeline_parallel = false;
  return out;
}

std::vector<std::string> ProgramCapabilities::problems(const TrainConfig& c) const {
  std::vector<std::string> out;
  const DistributedConfig& d = c.distributed;
  std::ostringstream os;
  auto flush = [&] {
    out.push_back(os.str());
    os.str("");
  };
  if (max_devices > 0 && d.world_size > max_devices) {
    os << "distributed.world_size = " << d.world_size << ": this program runs on at most "
       << max_devices
       << (max_devices == 1 ? " device (set distributed.enabled = false)" : " devices");
    flush();
  }
  // An explicit mesh may name axes of its own: one of size > 1 that no strategy of the
  // program splits work over leaves its devices computing the same thing.
  std::vector<std::string> used = {"data"};
  if (tensor_parallel) used.emplace_back("model");
  if (pipeline_parallel) used.emplace_back("pipe");
  if (context_parallel) used.emplace_back("context");
  if (expert_parallel) used.emplace_back("expert");
  for (std::size_t i = 0; i < d.mesh_axis_names.size() && i < d.mesh_shape.size(); ++i) {
    const std::string& axis = d.mesh_axis_names[i];
    if (d.mesh_shape[i] == 1 || std::find(used.begin(), used.end(), axis) != used.end()) continue;
    os << "mesh axis \"" << axis << "\" (size " << d.mesh_shape[i]
       << ") is used by no strategy of this program, which splits work over " << list(used)
       << " only: the " << d.mesh_shape[i]
       << " devices along it would compute the same thing. Remove it from "
          "distributed.mesh_axis_names / mesh_shape (or give it size 1), or fold its size "
          "into one of those axes";
    flush();
  }
  if (!tensor_parallel && d.tensor_parallel_size > 1) {
    os << "distributed.tensor_parallel_size = " << d.tensor_parallel_size
       << ": this program has no tensor parallelism (no \"model\" axis)";
    flush();
  }
  if (!pipeline_parallel && d.pipeline_parallel_size > 1) {
    os << "distributed.pipeline_parallel_size = " << d.pipeline_parallel_size
       << ": this program has no pipeline (no \"pipe\" axis)";
    flush();
  }
  if (!context_parallel && d.context_parallel_size > 1) {
    os << "distributed.context_parallel_size = " << d.context_parallel_size
       << ": this program has no context parallelism (no \"context\" axis: its model has no "
          "attention over a sequence to split)";
    flush();
  }
  if (!expert_parallel && d.expert_parallel_size > 1) {
    os << "distributed.expert_parallel_size = " << d.expert_parallel_size
       << ": this program has no expert parallelism (no \"expert\" axis: its model has no "
          "Mixture-of-Experts layer)";
    flush();
  }
  if (!runs(c.parallelism.shard)) {
    os << "parallelism.shard = \"" << shard_name(c.parallelism.shard)
       << "\" is not implemented for this program (it runs shard =";
    for (std::size_t i = 0; i < shards.size(); ++i)
      os << (i ? ", \"" : " \"") << shard_name(shards[i]) << "\"";
    os << ")";
    flush();
  }
  if (ties_embeddings && pipeline_parallel && c.model.tie_embeddings &&
      d.pipeline_parallel_size > 1) {
    // The parameter tree is the config's on every mesh, so a pipe axis does not untie it.
    os << "model.tie_embeddings = true with pipeline_parallel_size = " << d.pipeline_parallel_size
       << ": a pipeline's first and last stages cannot share the embedding wte; set "
          "model.tie_embeddings = false (an untied lm_head)";
    flush();
  }
  if (!mixed_precision && d.mixed_precision != MixedPrecision::No) {
    os << "distributed.mixed_precision = \"" << mixed_precision_name(d.mixed_precision)
       << "\" is not implemented for this program (it computes in f32); use \"no\"";
    flush();
  } else if (!fp16_pipeline && d.mixed_precision == MixedPrecision::Fp16 &&
             d.pipeline_parallel_size > 1) {
    os << "distributed.mixed_precision = \"fp16\" with pipeline_parallel_size = "
       << d.pipeline_parallel_size
       << " is not implemented for this program: it does not give its pipeline the train "
          "step's loss function (Pipeline::module_loss()), which the loss scale scales; use "
          "\"bf16\"";
    flush();
  }
  return out;
}

std::string ProgramCapabilities::str() const {
  std::string out = "mesh axes data";
  if (tensor_parallel) out += ", model";
  if (pipeline_parallel) out += ", pipe";
  if (context_parallel) out += ", context";
  if (max_devices > 0) out += " (at most " + std::to_string(max_devices) + " devices)";
  out += ";";
  for (Shard s : shards)
    out += s == Shard::None         ? " DP,"
           : s == Shard::Parameters ? " FSDP,"
                                    : " ZeRO-" + std::to_string(zero_stage(s)) + ",";
  out.back() = ';';
  out += mixed_precision ? " f32, bf16, fp16" : " f32";
  if (mixed_precision && pipeline_parallel && !fp16_pipeline) out += " (fp16 not with pipe)";
  return out;
}

}  // namespace distjax::config
