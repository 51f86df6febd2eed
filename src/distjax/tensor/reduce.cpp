#include "distjax/tensor/reduce.hpp"

#include <algorithm>

#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {
namespace {

std::vector<int> normalize_axes(const std::vector<int>& axes, int rank, const char* op) {
  std::vector<int> out;
  for (int a : axes)
    out.push_back(normalize_axis(a, rank, op));
  std::sort(out.begin(), out.end());
  DISTJAX_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), InvalidArgument, "[", op,
                "] an axis is repeated");
  return out;
}

Shape keepdims_shape(const Shape& s, const std::vector<int>& axes) {
  Shape out = s;
  for (int a : axes)
    out[a] = 1;
  return out;
}

Shape drop_axes(const Shape& s, const std::vector<int>& axes) {
  Shape out;
  for (int i = 0; i < static_cast<int>(s.size()); ++i)
    if (!std::binary_search(axes.begin(), axes.end(), i)) out.push_back(s[i]);
  return out;
}

using detail::Dispatch;
using detail::KernelTable;
using detail::ReduceOp;

// Reduces axes [a0, a1) of x (merged into one) viewed as (outer, r, inner); keeps them as 1.
Tensor reduce_axes(const char* op, ReduceOp code, const Tensor& x, int a0, int a1) {
  const Shape& s = x.shape();
  std::int64_t outer = 1, inner = 1, r = 1;
  for (int i = 0; i < a0; ++i)
    outer *= s[i];
  for (int i = a0; i < a1; ++i)
    r *= s[i];
  for (int i = a1; i < x.rank(); ++i)
    inner *= s[i];
  Shape os = s;
  for (int i = a0; i < a1; ++i)
    os[i] = 1;
  Tensor out = Tensor::empty(os, DType::F32, x.device());
  Dispatch k(op, &KernelTable::reduce, {&x, &out});
  k->reduce(code, x.data<float>(), out.data<float>(), outer, r, inner);
  return out;
}

// Reduction over sorted `axes` with keepdims, no recording: each run of adjacent axes is
// one pass. Returns a new tensor even when there is nothing to reduce.
Tensor reduce_raw(const char* op, ReduceOp code, const Tensor& x, const std::vector<int>& axes) {
  Tensor cur = x;
  for (int i = static_cast<int>(axes.size()) - 1; i >= 0;) {
    int j = i;
    while (j > 0 && axes[j - 1] == axes[j] - 1)
      --j;
    cur = reduce_axes(op, code, cur, axes[j], axes[i] + 1);
    i = j - 1;
  }
  return cur.shares_storage_with(x) ? x.clone() : cur;
}

Tensor sum_raw(const Tensor& x, const std::vector<int>& axes) {
  return reduce_raw("sum", ReduceOp::Sum, x, axes);
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int>& axes_in, bool keepdims) {
  detail::require_f32("sum", {&x});
  std::vector<int> axes = normalize_axes(axes_in, x.rank(), "sum");
  Tensor out = sum_raw(x, axes);
  if (!keepdims) out = out.view(drop_axes(x.shape(), axes));
  if (!needs_grad({&x})) return joined(out, {&x});
  return record(
      "sum", {x}, out,
      [xs = x.shape(), ks = keepdims_shape(x.shape(), axes)](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{broadcast_to(g[0].view(ks), xs)};
      });
}

Tensor sum(const Tensor& x) {
  std::vector<int> all(x.rank());
  for (int i = 0; i < x.rank(); ++i)
    all[i] = i;
  return sum(x, all, false);
}

Tensor mean(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  std::int64_t count = 1;
  for (int a : normalize_axes(axes, x.rank(), "mean"))
    count *= x.size(a);
  return mul_scalar(sum(x, axes, keepdims),
                    1.0 / static_cast<double>(std::max<std::int64_t>(count, 1)));
}

Tensor mean(const Tensor& x) {
  return mul_scalar(sum(x), 1.0 / static_cast<double>(std::max<std::int64_t>(x.numel(), 1)));
}

Tensor max(const Tensor& x, const std::vector<int>& axes_in, bool keepdims) {
  detail::require_f32("max", {&x});
  std::vector<int> axes = normalize_axes(axes_in, x.rank(), "max");
  for (int a : axes)
    DISTJAX_CHECK(x.size(a) > 0, InvalidArgument, "[max] empty axis ", a, " in ",
                  to_string(x.shape()));
  Tensor cur = reduce_raw("max", ReduceOp::Max, x, axes);
  Shape ks = cur.shape();
  Tensor out = keepdims ? cur : cur.view(drop_axes(x.shape(), axes));
  if (!needs_grad({&x})) return joined(out, {&x});
  return record(
      "max", {x}, out,
      [xd = x.detach(), md = cur.detach(), ks, axes](const std::vector<Tensor>& g) {
        // The cotangent goes to the first maximal element of each reduced group.
        if (axes.empty() || axes.back() - axes.front() + 1 == static_cast<int>(axes.size())) {
          // One run of axes: x is (outer, r, inner) and each group a strided column.
          const Shape& s = xd.shape();
          std::int64_t outer = 1, r = 1, inner = 1;
          const int a0 = axes.empty() ? 0 : axes.front(), a1 = axes.empty() ? 0 : axes.back() + 1;
          for (int i = 0; i < a0; ++i)
            outer *= s[i];
          for (int i = a0; i < a1; ++i)
            r *= s[i];
          for (int i = a1; i < xd.rank(); ++i)
            inner *= s[i];
          Tensor out = Tensor::zeros(s, DType::F32, xd.device());
          Dispatch k("max", &KernelTable::reduce, {&xd, &md, &g[0], &out});
          k->max_grad_run(xd.data<float>(), md.data<float>(), g[0].data<float>(), out.data<float>(),
                          outer, r, inner);
          return std::vector<Tensor>{out};
        }
        const Tensor gk = broadcast_to(g[0].view(ks), xd.shape());
        const Tensor mk = broadcast_to(md, xd.shape());
        Tensor out = Tensor::zeros(xd.shape(), DType::F32, xd.device());
        const detail::BroadcastPlan groups = detail::plan_broadcast(ks, xd.shape(), "max");
        Dispatch k("max", &KernelTable::reduce, {&xd, &mk, &gk, &out});
        k->max_grad_general(xd.data<float>(), mk.data<float>(), gk.data<float>(), out.data<float>(),
                            xd.numel(), groups, md.numel());
        return std::vector<Tensor>{out};
      });
}

Tensor max(const Tensor& x) {
  std::vector<int> all(x.rank());
  for (int i = 0; i < x.rank(); ++i)
    all[i] = i;
  return max(x, all, false);
}

Tensor argmax(const Tensor& x, int axis) {
  detail::require_f32("argmax", {&x});
  int a = normalize_axis(axis, x.rank(), "argmax");
  const Shape& s = x.shape();
  std::int64_t outer = 1, inner = 1, r = s[a];
  for (int i = 0; i < a; ++i)
    outer *= s[i];
  for (int i = a + 1; i < x.rank(); ++i)
    inner *= s[i];
  Shape os = s;
  os.erase(os.begin() + a);
  Tensor out = Tensor::empty(os, DType::I64, x.device());
  Dispatch k("argmax", &KernelTable::reduce, {&x, &out});
  k->argmax(x.data<float>(), out.data<std::int64_t>(), outer, r, inner);
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  DISTJAX_CHECK(shape.size() <= x.shape().size(), InvalidArgument, "[sum_to] cannot sum ",
                to_string(x.shape()), " to ", to_string(shape));
  const std::size_t lead = x.shape().size() - shape.size();
  std::vector<int> axes;
  for (std::size_t i = 0; i < x.shape().size(); ++i) {
    if (i < lead) {
      axes.push_back(static_cast<int>(i));
    } else if (shape[i - lead] == 1 && x.shape()[i] != 1) {
      axes.push_back(static_cast<int>(i));
    } else {
      DISTJAX_CHECK(shape[i - lead] == x.shape()[i], InvalidArgument, "[sum_to] cannot sum ",
                    to_string(x.shape()), " to ", to_string(shape));
    }
  }
  return reshape(sum(x, axes, true), shape);
}

}  // namespace distjax::tensor
