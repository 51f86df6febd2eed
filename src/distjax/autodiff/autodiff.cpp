#include "distjax/autodiff/autodiff.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "distjax/core/error.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::autodiff {

using tensor::Node;
using tensor::NoGradGuard;

namespace {

// Cotangents of one output summed; a bf16 or f16 one (a backward may hand those: see
// Node::reduced_cotangent) is widened, so the sum is f32.
void accumulate(Tensor& slot, const Tensor& g) {
  if (!slot.defined()) {
    slot = g;
  } else if (slot.dtype() == DType::F32 && g.dtype() == DType::F32) {
    slot = tensor::add(slot, g);
  } else {
    slot = tensor::add(tensor::astype(slot, DType::F32), tensor::astype(g, DType::F32));
  }
}

// Nodes reachable from the roots, newest first. Every node is newer than its inputs, so
// this is a topological order (each node before the nodes it consumes), and it is the
// forward order reversed: the backward of the compute that ran between an asynchronous
// op's start and done runs between their backward halves too (ppermute_start/done).
// Iterative, so deep tapes do not overflow.
std::vector<Node*> topological_order(const std::vector<Node*>& roots) {
  std::vector<Node*> nodes;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (Node* r : roots) {
    if (r && seen.insert(r).second) stack.push_back(r);
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    nodes.push_back(n);
    for (const auto& e : n->inputs) {
      Node* child = e.node.get();
      if (child && seen.insert(child).second) stack.push_back(child);
    }
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const Node* a, const Node* b) { return a->sequence > b->sequence; });
  return nodes;
}

}  // namespace

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& seeds,
                         const std::vector<Tensor>& wrt) {
  return grad(outputs, seeds, wrt, GradReadyFn{});
}

namespace {
std::vector<Tensor> grad_impl(const std::vector<Tensor>& outputs, const std::vector<Tensor>& seeds,
                              const std::vector<Tensor>& wrt, const GradReadyFn& on_ready,
                              bool zeros_for_unreached);
}  // namespace

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& seeds,
                         const std::vector<Tensor>& wrt, const GradReadyFn& on_ready) {
  return grad_impl(outputs, seeds, wrt, on_ready, /*zeros_for_unreached=*/true);
}

std::vector<Tensor> grad_if_reached(const std::vector<Tensor>& outputs,
                                    const std::vector<Tensor>& seeds,
                                    const std::vector<Tensor>& wrt) {
  return grad_impl(outputs, seeds, wrt, GradReadyFn{}, /*zeros_for_unreached=*/false);
}

namespace {
std::vector<Tensor> grad_impl(const std::vector<Tensor>& outputs, const std::vector<Tensor>& seeds,
                              const std::vector<Tensor>& wrt, const GradReadyFn& on_ready,
                              bool zeros_for_unreached) {
  DISTJAX_CHECK(outputs.size() == seeds.size(), InvalidArgument, "[grad] ", outputs.size(),
                " outputs but ", seeds.size(), " seeds");
  NoGradGuard no_grad;
  std::unordered_map<Node*, std::vector<Tensor>> pending;
  auto slot = [&](Node* n, int i) -> Tensor& {
    auto& v = pending[n];
    if (v.empty()) v.resize(n->output_shapes.size());
    return v[i];
  };

  std::vector<Node*> roots;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    if (!out.requires_grad()) continue;
    Tensor seed = seeds[i];
    if (!seed.defined()) {
      DISTJAX_CHECK(out.numel() == 1, InvalidArgument, "[grad] output ", i, " has shape ",
                    to_string(out.shape()), "; a seed is needed for non-scalar outputs");
      seed = Tensor::ones(out.shape(), out.dtype());
    }
    DISTJAX_CHECK(seed.shape() == out.shape(), InvalidArgument, "[grad] seed shape ",
                  to_string(seed.shape()), " differs from output shape ", to_string(out.shape()));
    accumulate(slot(out.grad_node().get(), out.grad_output_index()), seed);
    roots.push_back(out.grad_node().get());
  }

  std::unordered_map<Node*, std::vector<std::pair<int, std::size_t>>>
      wanted;  // node -> (output, wrt index)
  for (std::size_t j = 0; j < wrt.size(); ++j)
    if (wrt[j].requires_grad())
      wanted[wrt[j].grad_node().get()].push_back({wrt[j].grad_output_index(), j});
  std::vector<Tensor> result(wrt.size());

  const std::vector<Node*> order = topological_order(roots);
  // With on_ready: how many reachable ops still have to send a cotangent to each wanted
  // node; when it reaches zero the node's cotangent is final (all its consumers are newer
  // and have run), long before the loop reaches the node itself.
  std::unordered_map<Node*, int> waiting;
  std::vector<char> reported(wrt.size(), 0);
  auto report = [&](Node* n) {
    auto w = wanted.find(n);
    if (w == wanted.end()) return;
    auto p = pending.find(n);
    for (auto [out_index, j] : w->second) {
      if (reported[j]) continue;
      reported[j] = 1;
      Tensor g = p != pending.end() ? p->second[out_index] : Tensor();
      if (!g.defined()) g = Tensor::zeros(wrt[j].shape(), wrt[j].dtype());
      g.set_varying_axes(wrt[j].varying_axes());
      on_ready(j, g);
    }
  };
  if (on_ready) {
    for (Node* n : order)
      for (const auto& e : n->inputs)
        if (e.node && wanted.count(e.node.get())) ++waiting[e.node.get()];
    for (Node* r : roots)  // an output that is itself a wanted leaf
      if (wanted.count(r) && waiting[r] == 0) report(r);
  }

  // Every input edge of `node` has delivered its cotangent (or none).
  auto done_with = [&](Node* node) {
    for (const auto& edge : node->inputs)
      if (edge.node && wanted.count(edge.node.get()) && --waiting[edge.node.get()] == 0)
        report(edge.node.get());
  };
  for (Node* node : order) {
    auto it = pending.find(node);
    if (it == pending.end()) {
      if (on_ready) done_with(node);
      continue;
    }
    std::vector<Tensor> grads = std::move(it->second);
    pending.erase(it);
    if (auto w = wanted.find(node); w != wanted.end())
      for (auto [out_index, j] : w->second)
        result[j] = grads[out_index];
    if (node->is_leaf) continue;
    DISTJAX_CHECK(node->backward, Error, "[grad] the tape of op \"", node->name,
                  "\" was already consumed by an earlier backward pass");
    std::vector<Tensor> in_grads;
    if (node->backward_adding) {
      // The cotangent summed so far for input 0 goes to the backward, which hands back the
      // sum with its own: the slot takes it below as if it were empty.
      Tensor partial;
      const auto& first = node->inputs.empty() ? Node::Edge{} : node->inputs[0];
      if (auto p = first.node ? pending.find(first.node.get()) : pending.end();
          p != pending.end() && p->second[first.output_index].defined() &&
          p->second[first.output_index].dtype() == DType::F32)
        partial = std::move(p->second[first.output_index]);
      in_grads = node->backward_adding(grads, std::move(partial));
    } else {
      in_grads = node->backward(grads);
    }
    node->backward = nullptr;  // frees the tensors the op saved
    node->backward_adding = nullptr;
    DISTJAX_CHECK(in_grads.size() == node->inputs.size(), Error, "[grad] backward of \"",
                  node->name, "\" returned ", in_grads.size(), " cotangents for ",
                  node->inputs.size(), " inputs");
    for (std::size_t k = 0; k < in_grads.size(); ++k) {
      const auto& edge = node->inputs[k];
      if (!edge.node || !in_grads[k].defined()) continue;
      const Shape& want = edge.node->output_shapes[edge.output_index];
      DISTJAX_CHECK(in_grads[k].shape() == want, Error, "[grad] backward of \"", node->name,
                    "\" gave cotangent ", to_string(in_grads[k].shape()), " for input ", k,
                    " of shape ", to_string(want));
      accumulate(slot(edge.node.get(), edge.output_index), in_grads[k]);
    }
    if (on_ready) done_with(node);
  }

  // A cotangent has its primal's type, varying axes included (the implicit pvary of the
  // tape has already summed over the axes the primal does not vary over).
  for (std::size_t j = 0; j < wrt.size(); ++j) {
    if (!result[j].defined()) {
      if (!zeros_for_unreached) continue;
      result[j] = Tensor::zeros(wrt[j].shape(), wrt[j].dtype());
    }
    result[j].set_varying_axes(wrt[j].varying_axes());
    if (on_ready && !reported[j]) on_ready(j, result[j]);  // unused by the outputs
  }
  return result;
}
}  // namespace

namespace detail {

TensorTree make_leaves(const TensorTree& params) {
  return params.map(
      [](const Tensor& t) { return is_floating(t.dtype()) ? tensor::make_leaf(t) : t; });
}

TensorTree grads_of(const Tensor& loss, const TensorTree& leaves,
                    const std::function<void(const std::string&, const Tensor&)>& on_ready) {
  DISTJAX_CHECK(loss.defined() && loss.numel() == 1, InvalidArgument,
                "[value_and_grad] the function must return a scalar loss, got ",
                loss.defined() ? to_string(loss.shape()) : std::string("undefined"));
  std::vector<Tensor> wrt;
  std::vector<const std::string*> paths;
  wrt.reserve(leaves.size());
  for (auto& [p, t] : leaves) {
    wrt.push_back(t);
    paths.push_back(&p);
  }
  GradReadyFn ready;
  if (on_ready) ready = [&](std::size_t j, const Tensor& g) { on_ready(*paths[j], g); };
  std::vector<Tensor> g = grad({loss}, {Tensor()}, wrt, ready);
  TensorTree out;
  std::size_t i = 0;
  for (auto& [p, _] : leaves)
    out.set(p, g[i++]);
  return out;
}

}  // namespace detail

namespace {
std::vector<Tensor> detach_all(const std::vector<Tensor>& xs) {
  std::vector<Tensor> out;
  out.reserve(xs.size());
  for (auto& x : xs)
    out.push_back(x.defined() ? x.detach() : x);
  return out;
}
}  // namespace

std::vector<Tensor> custom_vjp(const char* name, const std::vector<Tensor>& inputs,
                               const CustomForward& forward, const CustomBackward& backward,
                               tensor::VaryingRule rule) {
  std::vector<Tensor> in = detach_all(inputs);
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;
    outs = forward(in);
  }
  if (!tensor::needs_grad(inputs)) {
    if (rule == tensor::VaryingRule::Join)
      for (Tensor& o : outs)
        o.set_varying_axes(tensor::joined_varying_axes(inputs));
    return outs;
  }
  std::vector<Tensor> saved_out = detach_all(outs);
  tensor::record(
      name, inputs, outs,
      [in, saved_out, backward](const std::vector<Tensor>& go) {
        return backward(in, saved_out, go);
      },
      rule);
  return outs;
}

Tensor custom_vjp1(const char* name, const std::vector<Tensor>& inputs,
                   const CustomForward& forward, const CustomBackward& backward,
                   tensor::VaryingRule rule) {
  auto outs = custom_vjp(name, inputs, forward, backward, rule);
  DISTJAX_CHECK(outs.size() == 1, InvalidArgument, "[custom_vjp1] forward of \"", name,
                "\" returned ", outs.size(), " outputs, expected 1");
  return outs[0];
}

namespace {
thread_local bool t_recomputing = false;
}  // namespace

bool recomputing() {
  return t_recomputing;
}

std::vector<Tensor> checkpoint(const RematFn& fn, const TensorTree& params,
                               const std::vector<Tensor>& inputs) {
  std::vector<Tensor> all = inputs;
  for (auto& [_, t] : params)
    all.push_back(t);
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;  // nothing inside is kept for the backward pass
    outs = fn(params, inputs);
  }
  // The outputs keep the varying axes their own ops gave them, and the recomputed graph
  // inserts its own implicit pvary, so the checkpoint node adds none (VaryingRule::AsIs).
  if (!tensor::needs_grad(all)) return outs;

  TensorTree saved_params = params.map([](const Tensor& t) { return t.detach(); });
  std::vector<Tensor> saved_inputs = detach_all(inputs);
  tensor::record(
      "checkpoint", all, outs,
      [fn, saved_params, saved_inputs](const std::vector<Tensor>& go) {
        tensor::EnableGradGuard on;
        TensorTree p = detail::make_leaves(saved_params);
        std::vector<Tensor> xs;
        for (auto& x : saved_inputs)
          xs.push_back(x.defined() && is_floating(x.dtype()) ? tensor::make_leaf(x) : x);
        std::vector<Tensor> re;
        {
          const bool was = t_recomputing;
          t_recomputing = true;
          struct Restore {
            bool was;
            ~Restore() { t_recomputing = was; }
          } restore{was};
          re = fn(p, xs);
        }
        std::vector<Tensor> used, seeds;
        for (std::size_t i = 0; i < re.size(); ++i) {
          if (go[i].defined()) {
            used.push_back(re[i]);
            seeds.push_back(go[i]);
          }
        }
        std::vector<Tensor> wrt = xs;
        for (auto& [_, t] : p)
          wrt.push_back(t);
        return grad(used, seeds, wrt);
      },
      tensor::VaryingRule::AsIs);
  return outs;
}

namespace {
thread_local double t_objective_scale = 1.0;
}  // namespace

double objective_scale() {
  return t_objective_scale;
}

ObjectiveScale::ObjectiveScale(double factor) : prev_(t_objective_scale) {
  t_objective_scale *= factor;
}

ObjectiveScale::~ObjectiveScale() {
  t_objective_scale = prev_;
}

Tensor add_loss(const Tensor& y, const Tensor& loss) {
  tensor::check_defined(y, "add_loss", "y");
  tensor::check_defined(loss, "add_loss", "loss");
  DISTJAX_CHECK(loss.numel() == 1, InvalidArgument, "[add_loss] the loss must be a scalar, got ",
                to_string(loss.shape()));
  if (!tensor::needs_grad({&y, &loss})) return y;
  // The loss's cotangent: the objective's scale, varying as the loss does (each device's
  // loss is its own term of the objective).
  const double scale = objective_scale();
  const Shape shape = loss.shape();
  const DType dtype = loss.dtype();
  const Device device = loss.device();
  const std::uint32_t vma = loss.varying_axes();
  return tensor::record(
      "add_loss", {y, loss}, y.detach(),
      [scale, shape, dtype, device, vma](std::vector<Tensor>& g) {
        Tensor c = Tensor::full(shape, scale, dtype, device);
        c.set_varying_axes(vma);
        return std::vector<Tensor>{g[0], c};
      },
      tensor::VaryingRule::AsIs);
}

}  // namespace distjax::autodiff
