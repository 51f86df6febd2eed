// The per-thread tape: the node every differentiable op records, grad mode, and the
// helper ops use to record themselves. The engine that walks the tape lives in autodiff.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

/// One recorded op (or a leaf). Nodes form a DAG through `inputs`; each thread (each
/// simulated device) builds its own, so devices never share a tape.
struct Node {
  /// Maps the cotangents of the outputs (an undefined tensor means zero) to the
  /// cotangents of the inputs, in input order (undefined = no gradient). Runs with grad
  /// mode off.
  using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

  /// An input edge: the node that produced input i and which of its outputs it was.
  struct Edge {
    std::shared_ptr<Node> node;  // null when the input does not require grad
    int output_index = 0;
  };

  const char* name = "leaf";
  std::vector<Edge> inputs;
  BackwardFn backward;  // empty for leaves; cleared after it runs to free saved tensors
  std::vector<Shape> output_shapes;
  std::vector<DType> output_dtypes;
  bool is_leaf = false;
  std::uint64_t sequence = 0;  // creation order on this thread, for deterministic traversal
};

/// Whether ops record themselves on this thread's tape (default true).
bool grad_enabled();
void set_grad_enabled(bool on);

/// Turns recording off for a scope (backward passes, optimizer updates, evaluation).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// Turns recording on for a scope (rematerialisation inside a backward pass).
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

/// Whether an op over `inputs` must be recorded: grad mode is on and some input
/// requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

/// Records an op with these inputs and outputs on the tape when needs_grad(inputs):
/// attaches a new node to every output. `backward` must not capture the outputs
/// themselves (that would be a reference cycle): capture `out.detach()` instead.
void record(const char* name, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
            Node::BackwardFn backward);
/// Single-output form; returns `out` with its node attached.
Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor out,
              Node::BackwardFn backward);

/// A fresh leaf that shares `t`'s storage and is differentiated with respect to.
Tensor make_leaf(const Tensor& t);

}  // namespace distjax::tensor
