#include "distjax/tensor/update_ops.hpp"

#include <algorithm>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/tensor/detail/group_indices.hpp"
#include "distjax/tensor/detail/sums_by_device.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {
namespace {

using detail::Dispatch;
using detail::KernelTable;
using detail::OptimLeaf;

// Every operand f32 and of `param`'s shape.
void check_leaf(const char* op, const Tensor& param, std::initializer_list<const Tensor*> others) {
  DISTJAX_CHECK(param.defined() && param.dtype() == DType::F32, InvalidArgument, "[", op,
                "] the parameter must be a defined f32 tensor");
  for (const Tensor* t : others)
    DISTJAX_CHECK(t->defined() && t->dtype() == DType::F32 && t->shape() == param.shape(),
                  InvalidArgument, "[", op, "] expected f32 ", to_string(param.shape()), ", got ",
                  t->defined() ? dtype_name(t->dtype()) : "undefined", " ",
                  t->defined() ? to_string(t->shape()) : std::string());
}

// The leaves of a multi-leaf op that go to one kernel call: those on one device with the
// same `kind` (SGD: with a buffer or without), in their order.
struct LeafGroup {
  Device device;
  bool kind = false;
  std::vector<const UpdateLeaf*> leaves;
  std::vector<const Tensor*> touched;  // every tensor of the leaves, for Dispatch
};

std::vector<LeafGroup> group_leaves(std::span<const UpdateLeaf> leaves,
                                    bool (*kind)(const UpdateLeaf&)) {
  std::vector<LeafGroup> groups;
  for (const std::vector<std::size_t>& at :
       detail::group_indices(leaves.size(), [&](std::size_t i) {
         return std::make_pair(leaves[i].param->device(), kind(leaves[i]));
       })) {
    LeafGroup& g = groups.emplace_back();
    g.device = leaves[at[0]].param->device();
    g.kind = kind(leaves[at[0]]);
    for (std::size_t i : at) {
      const UpdateLeaf& l = leaves[i];
      g.leaves.push_back(&l);
      for (const Tensor* t : {static_cast<const Tensor*>(l.param), l.grad,
                              static_cast<const Tensor*>(l.m), static_cast<const Tensor*>(l.v)})
        if (t) g.touched.push_back(t);
    }
  }
  return groups;
}

// The kernel records of a group's leaves (after its Dispatch: pointers into its tensors).
std::vector<detail::OptimLeaf> leaf_records(const LeafGroup& group) {
  std::vector<detail::OptimLeaf> records;
  records.reserve(group.leaves.size());
  for (const UpdateLeaf* l : group.leaves)
    records.push_back({.p = l->param->data<float>(),
                       .g = l->grad->data<float>(),
                       .m = l->m ? l->m->data<float>() : nullptr,
                       .v = l->v ? l->v->data<float>() : nullptr,
                       .n = l->param->numel(),
                       .decay = l->decay});
  return records;
}

// Whether two records' parameters share memory (tied leaves): a multi-leaf kernel may update
// its leaves concurrently, so such a group is updated leaf by leaf, as the per-leaf ops do.
bool parameters_overlap(std::vector<detail::OptimLeaf> records) {
  std::sort(records.begin(), records.end(),
            [](const detail::OptimLeaf& a, const detail::OptimLeaf& b) { return a.p < b.p; });
  for (std::size_t i = 1; i < records.size(); ++i)
    if (records[i - 1].n > 0 && records[i].p < records[i - 1].p + records[i - 1].n) return true;
  return false;
}

}  // namespace

void sgd_update_(Tensor& param, const Tensor& grad, Tensor& buf, const SGDStep& step) {
  if (!buf.defined()) {
    check_leaf("sgd_update_", param, {&grad});
    Dispatch k("sgd_update_", &KernelTable::update, {&param, &grad});
    k->sgd(param.data<float>(), grad.data<float>(), param.numel(), step.lr, step.weight_decay);
    return;
  }
  check_leaf("sgd_update_", param, {&grad, &buf});
  Dispatch k("sgd_update_", &KernelTable::update, {&param, &grad, &buf});
  k->sgd_momentum(param.data<float>(), grad.data<float>(), buf.data<float>(), param.numel(),
                  step.lr, step.momentum, step.weight_decay, step.nesterov);
}

void adam_update_(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamStep& step) {
  check_leaf("adam_update_", param, {&grad, &m, &v});
  Dispatch k("adam_update_", &KernelTable::update, {&param, &grad, &m, &v});
  k->adam(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), param.numel(),
          step.lr, step.b1, step.b2, step.eps, step.t, step.decay, step.l2);
}

void sgd_update_many_(std::span<const UpdateLeaf> leaves, const SGDStep& step) {
  for (const UpdateLeaf& l : leaves) {
    if (l.m)
      check_leaf("sgd_update_many_", *l.param, {l.grad, l.m});
    else
      check_leaf("sgd_update_many_", *l.param, {l.grad});
  }
  for (const LeafGroup& group :
       group_leaves(leaves, [](const UpdateLeaf& l) { return l.m != nullptr; })) {
    Dispatch k("sgd_update_many_", &KernelTable::update, group.touched);
    const std::vector<OptimLeaf> records = leaf_records(group);
    const bool many = group.kind ? k->sgd_momentum_many != nullptr : k->sgd_many != nullptr;
    const auto count = static_cast<std::int64_t>(records.size());
    if (many && !parameters_overlap(records)) {
      if (group.kind)
        k->sgd_momentum_many(records.data(), count, step.lr, step.momentum, step.weight_decay,
                             step.nesterov);
      else
        k->sgd_many(records.data(), count, step.lr, step.weight_decay);
      continue;
    }
    for (const OptimLeaf& r : records) {
      if (group.kind)
        k->sgd_momentum(r.p, r.g, r.m, r.n, step.lr, step.momentum, step.weight_decay,
                        step.nesterov);
      else
        k->sgd(r.p, r.g, r.n, step.lr, step.weight_decay);
    }
  }
}

void adam_update_many_(std::span<const UpdateLeaf> leaves, const AdamStep& step) {
  for (const UpdateLeaf& l : leaves) {
    DISTJAX_CHECK(l.m && l.v, InvalidArgument, "[adam_update_many_] a leaf has no moments");
    check_leaf("adam_update_many_", *l.param, {l.grad, l.m, l.v});
  }
  for (const LeafGroup& group : group_leaves(leaves, [](const UpdateLeaf&) { return false; })) {
    Dispatch k("adam_update_many_", &KernelTable::update, group.touched);
    const std::vector<OptimLeaf> records = leaf_records(group);
    if (k->adam_many && !parameters_overlap(records)) {
      k->adam_many(records.data(), static_cast<std::int64_t>(records.size()), step.lr, step.b1,
                   step.b2, step.eps, step.t, step.l2);
      continue;
    }
    for (const OptimLeaf& r : records)
      k->adam(r.p, r.g, r.m, r.v, r.n, step.lr, step.b1, step.b2, step.eps, step.t, r.decay,
              step.l2);
  }
}

double sum_of_squares(const Tensor& x) {
  check_leaf("sum_of_squares", x, {});
  detail::count_host_wait(x.device());
  Dispatch k("sum_of_squares", &KernelTable::update, {&x});
  double out = 0.0;
  k->sum_squares(x.data<float>(), x.numel(), &out);
  return out;
}

std::vector<double> sums_of_squares(const std::vector<Tensor>& xs) {
  for (const Tensor& x : xs)
    check_leaf("sums_of_squares", x, {});
  return detail::sums_by_device("sums_of_squares", xs, &KernelTable::update,
                                &detail::UpdateKernels::sum_squares_many);
}

NormAndClipFactor norm_and_clip_factor(const std::vector<Tensor>& xs, double max_norm) {
  std::vector<const Tensor*> touched;
  std::vector<const float*> ptrs;
  std::vector<std::int64_t> ns;
  for (const Tensor& x : xs) {
    check_leaf("norm_and_clip_factor", x, {});
    touched.push_back(&x);
    ptrs.push_back(x.data<float>());
    ns.push_back(x.numel());
  }
  const Device device = detail::op_device("norm_and_clip_factor", touched);
  NormAndClipFactor out{Tensor::empty({}, DType::F32, device),
                        Tensor::empty({}, DType::F32, device)};
  touched.push_back(&out.norm);
  touched.push_back(&out.factor);
  Dispatch k("norm_and_clip_factor", &KernelTable::update, touched);
  k->norm_and_clip_factor(ptrs.data(), ns.data(), static_cast<std::int64_t>(xs.size()), max_norm,
                          out.norm.data<float>(), out.factor.data<float>());
  return out;
}

void scale_by_(Tensor& x, const Tensor& factor) {
  check_leaf("scale_by_", x, {});
  DISTJAX_CHECK(factor.defined() && factor.dtype() == DType::F32 && factor.numel() == 1,
                InvalidArgument, "[scale_by_] the factor must be one f32 element, got ",
                factor.defined() ? factor.str(0) : std::string("undefined"));
  Dispatch k("scale_by_", &KernelTable::update, {&x, &factor});
  k->scale_by(x.data<float>(), x.numel(), factor.data<float>());
}

void scale_(Tensor& x, double factor) {
  check_leaf("scale_", x, {});
  Dispatch k("scale_", &KernelTable::update, {&x});
  k->scale(x.data<float>(), x.numel(), static_cast<float>(factor));
}

}  // namespace distjax::tensor
