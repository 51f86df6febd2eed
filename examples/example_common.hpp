// What the examples share: the backend flag and MPI detection, the process that prints,
// the classification loss with accuracy, and main()'s error handling.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "distjax/comm/launch.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/metrics.hpp"

namespace distjax::examples {

/// The default of --backend: "mpi" when started by mpirun (Open MPI's environment), else
/// "threads" (simulated devices in this process).
inline std::string default_backend() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") ? "mpi" : "threads";
}

/// The backend named by --backend; prints "<program>: --backend must be threads or mpi"
/// and returns false for another name.
inline bool parse_backend(const char* program, const std::string& name, comm::Backend* out) {
  if (name == "threads" || name == "mpi") {
    *out = name == "mpi" ? comm::Backend::Mpi : comm::Backend::Threads;
    return true;
  }
  std::fprintf(stderr, "%s: --backend must be threads or mpi, got %s\n", program, name.c_str());
  return false;
}

/// Under mpirun, the number of processes (OMPI_COMM_WORLD_SIZE); 0 otherwise.
inline long long mpi_world_size() {
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  return n ? std::atoll(n) : 0;
}

/// Whether this process prints the run's header lines: rank 0 under mpirun, always with
/// threads (device programs print from their device 0 themselves).
inline bool main_process() {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  return rank == nullptr || std::string(rank) == "0";
}

/// Mean cross-entropy of logits (B, K) against i32 labels (B), with "accuracy" as
/// (rows where argmax == label, B).
inline std::pair<tensor::Tensor, train::Metrics> classification_loss(const tensor::Tensor& logits,
                                                                     const tensor::Tensor& labels) {
  const auto pred = tensor::argmax(logits.detach(), -1).to_vector<std::int64_t>();
  const std::int32_t* y = labels.data<std::int32_t>();
  double correct = 0;
  for (std::size_t i = 0; i < pred.size(); ++i)
    correct += pred[i] == y[i];
  train::Metrics m;
  m.add("accuracy", correct, static_cast<double>(pred.size()));
  return {tensor::mean(tensor::cross_entropy(logits, labels)), m};
}

/// main()'s body: runs `fn`; an exception prints "<program>: <message>" and returns 1.
inline int run_main(const char* program, const std::function<int()>& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace distjax::examples
