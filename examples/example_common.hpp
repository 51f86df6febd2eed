// What the examples share: the backend flag, the classification loss with accuracy, and
// main()'s error handling. (Launcher detection lives in comm/launch_environment.hpp.)
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "distjax/config/distributed_config.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/metrics.hpp"

namespace distjax::examples {

/// The value of --backend: "auto" (mpi when started by mpirun or srun, else threads),
/// "threads" or "mpi"; prints "<program>: --backend must be auto, threads or mpi" and
/// returns false for another name.
inline bool parse_backend(const char* program, const std::string& name,
                          config::BackendChoice* out) {
  if (name == "auto" || name == "threads" || name == "mpi") {
    *out = name == "mpi"       ? config::BackendChoice::Mpi
           : name == "threads" ? config::BackendChoice::Threads
                               : config::BackendChoice::Auto;
    return true;
  }
  std::fprintf(stderr, "%s: --backend must be auto, threads or mpi, got %s\n", program,
               name.c_str());
  return false;
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
