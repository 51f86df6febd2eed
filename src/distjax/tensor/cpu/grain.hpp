// The CPU kernels' parallel grains: how many elements a loop needs before OpenMP threads
// share it.
#pragma once

#include <cstdint>

namespace distjax::tensor::detail {

/// Elements below which a compute-heavy loop (exp, tanh, erf per element; attention
/// heads) runs on one thread.
constexpr std::int64_t kParallelGrain = 32768;
/// Elements below which a loop of a few flops per element (copies, adds, broadcasts,
/// norms, reductions) runs on one thread. Such loops are memory-bound, but while one
/// thread runs them the others only wait: at 2^18 (1 MiB of f32) the GPT benchmark's
/// (B*T, d) activations (2^19 elements: residual adds, layer norms, their gradients) go
/// parallel, which made its steps a few percent faster on 2 idle cores.
/// Below it, a parallel region's fork/join and the risk of stalling for a scheduler
/// time slice when the cores are shared with other processes outweigh the gain.
constexpr std::int64_t kParallelGrainMemory = std::int64_t(1) << 18;

}  // namespace distjax::tensor::detail
