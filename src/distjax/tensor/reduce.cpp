#include "distjax/tensor/reduce.hpp"

#include <algorithm>
#include <limits>

#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::tensor {
namespace {

std::vector<int> normalize_axes(const std::vector<int>& axes, int rank, const char* op) {
  std::vector<int> out;
  for (int a : axes) out.push_back(normalize_axis(a, rank, op));
  std::sort(out.begin(), out.end());
  DISTJAX_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), InvalidArgument, "[", op,
                "] an axis is repeated");
  return out;
}

Shape keepdims_shape(const Shape& s, const std::vector<int>& axes) {
  Shape out = s;
  for (int a : axes) out[a] = 1;
  return out;
}

Shape drop_axes(const Shape& s, const std::vector<int>& axes) {
  Shape out;
  for (int i = 0; i < static_cast<int>(s.size()); ++i)
    if (!std::binary_search(axes.begin(), axes.end(), i)) out.push_back(s[i]);
  return out;
}

// Reduces one axis of x viewed as (outer, r, inner) with `combine`, starting from `init`.
template <class F>
Tensor reduce_axis(const Tensor& x, int axis, float init, F combine) {
  const Shape& s = x.shape();
  std::int64_t outer = 1, inner = 1, r = s[axis];
  for (int i = 0; i < axis; ++i) outer *= s[i];
  for (int i = axis + 1; i < x.rank(); ++i) inner *= s[i];
  Shape os = s;
  os[axis] = 1;
  Tensor out = Tensor::empty(os);
  const float* px = x.data<float>();
  float* po = out.data<float>();
  if (inner == 1) {
#pragma omp parallel for if (outer * r > detail::kParallelGrain)
    for (std::int64_t o = 0; o < outer; ++o) {
      const float* row = px + o * r;
      float acc = init;
      for (std::int64_t j = 0; j < r; ++j) acc = combine(acc, row[j]);
      po[o] = acc;
    }
  } else {
#pragma omp parallel for if (outer * r * inner > detail::kParallelGrain)
    for (std::int64_t o = 0; o < outer; ++o) {
      float* dst = po + o * inner;
      std::fill(dst, dst + inner, init);
      for (std::int64_t j = 0; j < r; ++j) {
        const float* src = px + (o * r + j) * inner;
#pragma omp simd
        for (std::int64_t i = 0; i < inner; ++i) dst[i] = combine(dst[i], src[i]);
      }
    }
  }
  return out;
}

// Sum with keepdims, no recording.
Tensor sum_raw(const Tensor& x, const std::vector<int>& axes) {
  Tensor cur = x;
  // Merge all-leading axes into one pass: x viewed as (prod(lead), rest) summed over rows.
  for (int i = static_cast<int>(axes.size()) - 1; i >= 0; --i)
    cur = reduce_axis(cur, axes[i], 0.f, [](float a, float b) { return a + b; });
  return cur.defined() && cur.shares_storage_with(x) ? x.clone() : cur;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int>& axes_in, bool keepdims) {
  detail::require_f32("sum", {&x});
  std::vector<int> axes = normalize_axes(axes_in, x.rank(), "sum");
  Tensor out = sum_raw(x, axes);
  if (!keepdims) out = out.view(drop_axes(x.shape(), axes));
  if (!needs_grad({&x})) return out;
  return record("sum", {x}, out, [xs = x.shape(), ks = keepdims_shape(x.shape(), axes)](
                                     const std::vector<Tensor>& g) {
    return std::vector<Tensor>{broadcast_to(g[0].view(ks), xs)};
  });
}

Tensor sum(const Tensor& x) {
  std::vector<int> all(x.rank());
  for (int i = 0; i < x.rank(); ++i) all[i] = i;
  return sum(x, all, false);
}

Tensor mean(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  std::int64_t count = 1;
  for (int a : normalize_axes(axes, x.rank(), "mean")) count *= x.size(a);
  return mul_scalar(sum(x, axes, keepdims), 1.0 / static_cast<double>(std::max<std::int64_t>(count, 1)));
}

Tensor mean(const Tensor& x) { return mul_scalar(sum(x), 1.0 / static_cast<double>(std::max<std::int64_t>(x.numel(), 1))); }

Tensor max(const Tensor& x, const std::vector<int>& axes_in, bool keepdims) {
  detail::require_f32("max", {&x});
  std::vector<int> axes = normalize_axes(axes_in, x.rank(), "max");
  for (int a : axes)
    DISTJAX_CHECK(x.size(a) > 0, InvalidArgument, "[max] empty axis ", a, " in ", to_string(x.shape()));
  Tensor cur = x;
  for (int i = static_cast<int>(axes.size()) - 1; i >= 0; --i)
    cur = reduce_axis(cur, axes[i], -std::numeric_limits<float>::infinity(),
                      [](float a, float b) { return b > a ? b : a; });
  if (cur.shares_storage_with(x)) cur = x.clone();
  Shape ks = cur.shape();
  Tensor out = keepdims ? cur : cur.view(drop_axes(x.shape(), axes));
  if (!needs_grad({&x})) return out;
  return record("max", {x}, out, [xd = x.detach(), md = cur.detach(), ks](const std::vector<Tensor>& g) {
    // The cotangent goes to the first maximal element of each reduced group.
    const Tensor gk = broadcast_to(g[0].view(ks), xd.shape());
    const Tensor mk = broadcast_to(md, xd.shape());
    Tensor out = Tensor::zeros(xd.shape());
    const float* px = xd.data<float>();
    const float* pm = mk.data<float>();
    const float* pg = gk.data<float>();
    float* po = out.data<float>();
    std::vector<char> taken(static_cast<std::size_t>(md.numel()), 0);
    const std::int64_t n = xd.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      if (px[i] != pm[i]) continue;
      std::int64_t group = detail::broadcast_index(ks, xd.shape(), i);
      if (taken[group]) continue;
      taken[group] = 1;
      po[i] = pg[i];
    }
    return std::vector<Tensor>{out};
  });
}

Tensor max(const Tensor& x) {
  std::vector<int> all(x.rank());
  for (int i = 0; i < x.rank(); ++i) all[i] = i;
  return max(x, all, false);
}

Tensor argmax(const Tensor& x, int axis) {
  detail::require_f32("argmax", {&x});
  int a = normalize_axis(axis, x.rank(), "argmax");
  const Shape& s = x.shape();
  std::int64_t outer = 1, inner = 1, r = s[a];
  for (int i = 0; i < a; ++i) outer *= s[i];
  for (int i = a + 1; i < x.rank(); ++i) inner *= s[i];
  Shape os = s;
  os.erase(os.begin() + a);
  Tensor out = Tensor::empty(os, DType::I64);
  const float* px = x.data<float>();
  std::int64_t* po = out.data<std::int64_t>();
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      std::int64_t best = 0;
      for (std::int64_t j = 1; j < r; ++j)
        if (px[(o * r + j) * inner + i] > px[(o * r + best) * inner + i]) best = j;
      po[o * inner + i] = best;
    }
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
