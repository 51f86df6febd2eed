#include "distjax/tensor/grad_node.hpp"

namespace distjax::tensor {
namespace {
thread_local bool t_grad_enabled = true;
thread_local std::uint64_t t_sequence = 0;
}  // namespace

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
            Node::BackwardFn backward) {
  if (!needs_grad(inputs)) return;
  auto node = std::make_shared<Node>();
  node->name = name;
  node->sequence = ++t_sequence;
  node->backward = std::move(backward);
  node->inputs.reserve(inputs.size());
  for (const Tensor& t : inputs) node->inputs.push_back({t.grad_node(), t.grad_output_index()});
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    node->output_shapes.push_back(outputs[i].shape());
    node->output_dtypes.push_back(outputs[i].dtype());
    outputs[i].set_grad_node(node, static_cast<int>(i));
  }
}

Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor out,
              Node::BackwardFn backward) {
  std::vector<Tensor> outs{std::move(out)};
  record(name, inputs, outs, std::move(backward));
  return std::move(outs[0]);
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

}  // namespace distjax::tensor
