// What one device of a pipeline stage holds in the plan: its parameter leaves, and the
// activation peak of one training step, found by running the stage's schedule
// (parallel::make_schedule) over a per-micro-batch model of what each forward keeps and
// each backward allocates. Private to plan.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "distjax/plan/setup.hpp"

namespace distjax::plan::detail {

/// One parameter as a device of the stage holds it.
struct LocalLeaf {
  const ParamInfo* param = nullptr;
  std::int64_t elems = 0;     ///< stored on this device
  std::int64_t gathered = 0;  ///< FSDP: elements after the gather (0 = not fully sharded)
  int chunk = 0;              ///< the pipeline chunk that uses it (0 without a pipeline)
};

/// The leaves stage `stage` holds: its chunks' blocks (chunk c runs on stage c % p, layers
/// split evenly over the p v chunks), the embeddings with chunk 0, the final norm and an
/// untied head with the last chunk (a tied head's embedding is counted once, on chunk 0).
/// Every leaf when pipe = 1.
std::vector<LocalLeaf> stage_leaves(const ModelDescription& m, const Setup& s, int stage);

/// The GPT's activation peak on stage `stage` (Plan::activations), from its leaves.
double gpt_activation_peak(const ModelDescription& m, const Setup& s, int stage,
                           const std::vector<LocalLeaf>& leaves);

}  // namespace distjax::plan::detail
