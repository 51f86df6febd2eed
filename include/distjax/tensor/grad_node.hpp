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
  /// mode off. The cotangents are the pass's own: a backward may drop one it has used
  /// (assign an undefined tensor) so its memory goes before the backward's own results
  /// are made (a matmul's f32 cotangent once cast to bf16).
  using BackwardFn = std::function<std::vector<Tensor>(std::vector<Tensor>& grad_outputs)>;

  /// An input edge: the node that produced input i and which of its outputs it was.
  struct Edge {
    std::shared_ptr<Node> node;  // null when the input does not require grad
    int output_index = 0;
  };

  /// A backward that also takes `partial`, the f32 cotangent the tape has summed so far for
  /// input 0 (undefined when there is none), adds its own cotangent for input 0 into it in
  /// its own kernel (in place where `partial` is its alone), and hands back that sum as input
  /// 0's cotangent: one pass instead of its output and the tape's add. For a norm after a
  /// residual connection, whose input's other consumer (the residual) ran its backward first.
  using AddingBackwardFn =
      std::function<std::vector<Tensor>(std::vector<Tensor>& grad_outputs, Tensor partial)>;

  const char* name = "leaf";
  std::vector<Edge> inputs;
  BackwardFn backward;  // empty for leaves; cleared after it runs to free saved tensors
  /// Set (besides `backward`) by an op whose backward can add into input 0's cotangent;
  /// the tape then calls it instead of `backward`. Cleared with it.
  AddingBackwardFn backward_adding;
  std::vector<Shape> output_shapes;
  std::vector<DType> output_dtypes;
  bool is_leaf = false;
  /// Whether the backward takes the cotangent of a bf16 or f16 output in that dtype as it
  /// takes an f32 one (a bf16 attention, linear with a bf16 epilogue): then an op whose
  /// backward makes that cotangent (linear's dX) may write it in the output's dtype.
  bool reduced_cotangent = false;
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

/// `out` with its node marked Node::reduced_cotangent where out is bf16 or f16 and
/// recorded: for an op whose backward takes that output's cotangent in its own dtype.
Tensor takes_reduced_cotangent(Tensor out);
/// Whether x is bf16 or f16 and its producer takes x's cotangent in that dtype (marked by
/// takes_reduced_cotangent): an op's backward may then hand it over so.
bool accepts_reduced_cotangent(const Tensor& x);

// ------------------------------------------------------------ varying mesh axes
// Inside shard_map every tensor carries the set of mesh axes it varies over
// (Tensor::varying_axes, JAX's vma). An op's result varies over the union of its
// inputs' sets. When a differentiated input varies over fewer axes than the union, the
// tape routes its edge through an implicit pvary (identity forward, sum over the missing
// axes backward), so a replicated value used by per-device code gets the sum of the
// per-device cotangents, as the math requires. The sum is a collective, run through the
// hook the spmd layer installs on each device thread.

/// What the tape needs from the spmd layer: the sum of a cotangent over mesh axes.
class VaryingAxesHook {
 public:
  virtual ~VaryingAxesHook() = default;
  /// Sum of `g` over the devices that differ from this one along the mesh axes in
  /// `axes` (bit mask); the result varies over g's axes minus `axes`. Collective.
  virtual Tensor psum_mask(const Tensor& g, std::uint32_t axes) = 0;
};
/// The hook of this thread (null outside shard_map).
VaryingAxesHook* varying_axes_hook();
/// Installs `hook` for this thread for the guard's lifetime (shard_map does this).
class VaryingAxesHookGuard {
 public:
  explicit VaryingAxesHookGuard(VaryingAxesHook* hook);
  ~VaryingAxesHookGuard();
  VaryingAxesHookGuard(const VaryingAxesHookGuard&) = delete;
  VaryingAxesHookGuard& operator=(const VaryingAxesHookGuard&) = delete;

 private:
  VaryingAxesHook* prev_;
};

/// Union of the inputs' varying axes.
std::uint32_t joined_varying_axes(std::initializer_list<const Tensor*> inputs);
std::uint32_t joined_varying_axes(const std::vector<Tensor>& inputs);
/// `out` marked as varying over the union of the inputs' axes: the no-grad return path
/// of every op (`if (!needs_grad(in)) return joined(out, in);`).
Tensor joined(Tensor out, std::initializer_list<const Tensor*> inputs);
Tensor joined(Tensor out, const std::vector<Tensor>& inputs);

/// How record treats varying axes.
enum class VaryingRule {
  /// Outputs vary over the union of the inputs' axes; differentiated inputs that vary
  /// over fewer axes get an implicit pvary (every ordinary op).
  Join,
  /// The op sets its outputs' axes itself and its backward already handles them
  /// (collectives, checkpoint, whose recomputed graph inserts its own pvary).
  AsIs,
};

/// Records an op with these inputs and outputs on the tape when needs_grad(inputs):
/// attaches a new node to every output, and applies `rule` to varying axes (also when
/// nothing is recorded). `backward` must not capture the outputs themselves (that would
/// be a reference cycle): capture `out.detach()` instead.
void record(const char* name, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
            Node::BackwardFn backward, VaryingRule rule = VaryingRule::Join);
/// Single-output form; returns `out` with its node attached.
Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor out,
              Node::BackwardFn backward, VaryingRule rule = VaryingRule::Join);

/// A fresh leaf that shares `t`'s storage and is differentiated with respect to.
Tensor make_leaf(const Tensor& t);

// ------------------------------------------------------------ deferred weight cotangents

/// Zero-bubble pipeline schedules split a backward pass in two: the input cotangents,
/// which the previous stage waits for, at once, and the weight cotangents later, where they
/// fill what would be bubbles. While a store is installed on a thread (WeightGradStoreGuard),
/// linear and matmul return no cotangent for a weight operand that is a parameter leaf and
/// queue the product that computes it instead (it keeps the op's input and output
/// cotangent alive until then), and linear does the same for its bias's row sum; run()
/// computes them.
class WeightGradStore {
 public:
  using Job = std::function<Tensor()>;
  /// Queues `job`, which computes the cotangent of `leaf`'s (single) output.
  void defer(std::shared_ptr<Node> leaf, Job job);
  /// Runs the queued jobs in order; returns (leaf, cotangent) pairs and empties the store.
  std::vector<std::pair<std::shared_ptr<Node>, Tensor>> run();
  bool empty() const { return jobs_.empty(); }
  std::size_t size() const { return jobs_.size(); }

 private:
  std::vector<std::pair<std::shared_ptr<Node>, Job>> jobs_;
};

/// The store of this thread, or null (the default: every cotangent computed at once).
WeightGradStore* weight_grad_store();

/// Installs `store` for this thread for the guard's lifetime.
class WeightGradStoreGuard {
 public:
  explicit WeightGradStoreGuard(WeightGradStore* store);
  ~WeightGradStoreGuard();
  WeightGradStoreGuard(const WeightGradStoreGuard&) = delete;
  WeightGradStoreGuard& operator=(const WeightGradStoreGuard&) = delete;

 private:
  WeightGradStore* prev_;
};

/// At record time: w's leaf node when an op over `inputs` may defer w's cotangent (w is a
/// differentiated leaf and no implicit pvary sits on its edge, so the cotangent goes to
/// the leaf unchanged); null otherwise.
std::shared_ptr<Node> deferrable_weight(const Tensor& w, const std::vector<Tensor>& inputs);

}  // namespace distjax::tensor
