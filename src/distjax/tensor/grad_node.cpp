#include "distjax/tensor/grad_node.hpp"

namespace distjax::tensor {
namespace {
thread_local bool t_grad_enabled = true;
thread_local std::uint64_t t_sequence = 0;
thread_local VaryingAxesHook* t_hook = nullptr;

// The edge to `t` routed through an implicit pvary over `missing` (identity forward,
// psum over `missing` backward).
Node::Edge pvary_edge(const Tensor& t, std::uint32_t missing) {
  DISTJAX_CHECK(t_hook != nullptr, Error,
                "[autodiff] a tensor varies over mesh axes outside shard_map");
  auto node = std::make_shared<Node>();
  node->name = "pvary(implicit)";
  node->sequence = ++t_sequence;
  node->inputs.push_back({t.grad_node(), t.grad_output_index()});
  node->output_shapes.push_back(t.shape());
  node->output_dtypes.push_back(t.dtype());
  VaryingAxesHook* hook = t_hook;
  node->backward = [hook, missing](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].defined() ? hook->psum_mask(g[0], missing) : Tensor()};
  };
  return {std::move(node), 0};
}
}  // namespace

VaryingAxesHook* varying_axes_hook() { return t_hook; }
VaryingAxesHookGuard::VaryingAxesHookGuard(VaryingAxesHook* hook) : prev_(t_hook) { t_hook = hook; }
VaryingAxesHookGuard::~VaryingAxesHookGuard() { t_hook = prev_; }

std::uint32_t joined_varying_axes(std::initializer_list<const Tensor*> inputs) {
  std::uint32_t m = 0;
  for (const Tensor* t : inputs) m |= t->varying_axes();
  return m;
}
std::uint32_t joined_varying_axes(const std::vector<Tensor>& inputs) {
  std::uint32_t m = 0;
  for (const Tensor& t : inputs) m |= t.varying_axes();
  return m;
}
Tensor joined(Tensor out, std::initializer_list<const Tensor*> inputs) {
  out.set_varying_axes(joined_varying_axes(inputs));
  return out;
}
Tensor joined(Tensor out, const std::vector<Tensor>& inputs) {
  out.set_varying_axes(joined_varying_axes(inputs));
  return out;
}

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool on) { t_grad_enabled = on; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t->requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.requires_grad()) return true;
  return false;
}

void record(const char* name, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
            Node::BackwardFn backward, VaryingRule rule) {
  const std::uint32_t vma = rule == VaryingRule::Join ? joined_varying_axes(inputs) : 0;
  if (rule == VaryingRule::Join)
    for (Tensor& o : outputs) o.set_varying_axes(vma);
  if (!needs_grad(inputs)) return;
  auto node = std::make_shared<Node>();
  node->name = name;
  node->backward = std::move(backward);
  node->inputs.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    const std::uint32_t missing = vma & ~t.varying_axes();
    if (rule == VaryingRule::Join && missing != 0 && t.requires_grad())
      node->inputs.push_back(pvary_edge(t, missing));
    else
      node->inputs.push_back({t.grad_node(), t.grad_output_index()});
  }
  // After the implicit pvary nodes: a node is always newer than its inputs (the backward
  // pass runs nodes in reverse creation order).
  node->sequence = ++t_sequence;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    node->output_shapes.push_back(outputs[i].shape());
    node->output_dtypes.push_back(outputs[i].dtype());
    outputs[i].set_grad_node(node, static_cast<int>(i));
  }
}

Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor out,
              Node::BackwardFn backward, VaryingRule rule) {
  std::vector<Tensor> outs{std::move(out)};
  record(name, inputs, outs, std::move(backward), rule);
  return std::move(outs[0]);
}

Tensor takes_reduced_cotangent(Tensor out) {
  if (out.grad_node() && out.dtype() != DType::F32) out.grad_node()->reduced_cotangent = true;
  return out;
}

bool accepts_reduced_cotangent(const Tensor& x) {
  return x.dtype() != DType::F32 && x.grad_node() && x.grad_node()->reduced_cotangent;
}

Tensor make_leaf(const Tensor& t) {
  auto node = std::make_shared<Node>();
  node->is_leaf = true;
  node->sequence = ++t_sequence;
  node->output_shapes.push_back(t.shape());
  node->output_dtypes.push_back(t.dtype());
  Tensor leaf = t.detach();
  leaf.set_grad_node(std::move(node), 0);
  return leaf;
}


namespace {
thread_local WeightGradStore* t_weight_grad_store = nullptr;
}  // namespace

void WeightGradStore::defer(std::shared_ptr<Node> leaf, Job job) {
  jobs_.emplace_back(std::move(leaf), std::move(job));
}

std::vector<std::pair<std::shared_ptr<Node>, Tensor>> WeightGradStore::run() {
  NoGradGuard no_grad;
  std::vector<std::pair<std::shared_ptr<Node>, Tensor>> out;
  out.reserve(jobs_.size());
  for (auto& [leaf, job] : jobs_)
    out.emplace_back(std::move(leaf), job());
  jobs_.clear();
  return out;
}

WeightGradStore* weight_grad_store() {
  return t_weight_grad_store;
}

WeightGradStoreGuard::WeightGradStoreGuard(WeightGradStore* store) : prev_(t_weight_grad_store) {
  t_weight_grad_store = store;
}

WeightGradStoreGuard::~WeightGradStoreGuard() {
  t_weight_grad_store = prev_;
}

std::shared_ptr<Node> deferrable_weight(const Tensor& w, const std::vector<Tensor>& inputs) {
  const std::shared_ptr<Node>& n = w.grad_node();
  if (!w.requires_grad() || !n || !n->is_leaf) return nullptr;
  const std::uint32_t all = joined_varying_axes(inputs);
  if ((w.varying_axes() & all) != all) return nullptr;  // an implicit pvary on its edge
  return n;
}

}  // namespace distjax::tensor
