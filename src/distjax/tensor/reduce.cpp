#include "distjax/tensor/reduce.hpp"

#include <omp.h>

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

enum class ReduceOp { Sum, Max };

template <ReduceOp Op>
inline float combine(float a, float b) {
  if constexpr (Op == ReduceOp::Sum)
    return a + b;
  else
    return b > a ? b : a;
}

template <ReduceOp Op>
constexpr float reduce_init() {
  return Op == ReduceOp::Sum ? 0.f : -std::numeric_limits<float>::infinity();
}

// dst[o, i] = combine over j in [j0, j1) of src[o, j, i], for x viewed as (outer, r, inner).
template <ReduceOp Op>
void reduce_block(const float* px, float* dst, std::int64_t o0, std::int64_t o1, std::int64_t r,
                  std::int64_t inner, std::int64_t j0, std::int64_t j1) {
  for (std::int64_t o = o0; o < o1; ++o) {
    if (inner == 1) {
      const float* row = px + o * r;
      float acc = reduce_init<Op>();
      if constexpr (Op == ReduceOp::Sum) {
#pragma omp simd reduction(+ : acc)
        for (std::int64_t j = j0; j < j1; ++j)
          acc += row[j];
      } else {
#pragma omp simd reduction(max : acc)
        for (std::int64_t j = j0; j < j1; ++j)
          acc = std::max(acc, row[j]);
      }
      dst[o] = acc;
      continue;
    }
    float* d = dst + o * inner;
    std::fill(d, d + inner, reduce_init<Op>());
    for (std::int64_t j = j0; j < j1; ++j) {
      const float* src = px + (o * r + j) * inner;
#pragma omp simd
      for (std::int64_t i = 0; i < inner; ++i)
        d[i] = combine<Op>(d[i], src[i]);
    }
  }
}

// Reduces axes [a0, a1) of x (merged into one) viewed as (outer, r, inner); keeps them as 1.
// Parallel over `outer` when it has enough rows for every thread, else over chunks of
// `r` into per-thread partials combined in thread order (deterministic for a given
// thread count): the (N, C) -> (C) bias-gradient case takes the second path.
template <ReduceOp Op>
Tensor reduce_axes(const Tensor& x, int a0, int a1) {
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
  Tensor out = Tensor::empty(os);
  const float* px = x.data<float>();
  float* po = out.data<float>();
  const std::int64_t work = outer * r * inner;
  const int nt = work > detail::kParallelGrainMemory ? omp_get_max_threads() : 1;
  if (nt == 1 || r <= 1) {
    reduce_block<Op>(px, po, 0, outer, r, inner, 0, r);
  } else if (outer >= 4 * nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (std::int64_t o = 0; o < outer; ++o)
      reduce_block<Op>(px, po, o, o + 1, r, inner, 0, r);
  } else {
    const std::int64_t len = outer * inner;
    std::vector<float> part(static_cast<std::size_t>(nt * len), reduce_init<Op>());
#pragma omp parallel num_threads(nt)
    {
      const std::int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
      reduce_block<Op>(px, part.data() + t * len, 0, outer, r, inner, r * t / n, r * (t + 1) / n);
    }
    std::copy(part.begin(), part.begin() + len, po);
    for (int t = 1; t < nt; ++t) {
      const float* src = part.data() + t * len;
#pragma omp simd
      for (std::int64_t i = 0; i < len; ++i)
        po[i] = combine<Op>(po[i], src[i]);
    }
  }
  return out;
}

// Reduction over sorted `axes` with keepdims, no recording: each run of adjacent axes is
// one pass. Returns a new tensor even when there is nothing to reduce.
template <ReduceOp Op>
Tensor reduce_raw(const Tensor& x, const std::vector<int>& axes) {
  Tensor cur = x;
  for (int i = static_cast<int>(axes.size()) - 1; i >= 0;) {
    int j = i;
    while (j > 0 && axes[j - 1] == axes[j] - 1)
      --j;
    cur = reduce_axes<Op>(cur, axes[j], axes[i] + 1);
    i = j - 1;
  }
  return cur.shares_storage_with(x) ? x.clone() : cur;
}

Tensor sum_raw(const Tensor& x, const std::vector<int>& axes) {
  return reduce_raw<ReduceOp::Sum>(x, axes);
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
  Tensor cur = reduce_raw<ReduceOp::Max>(x, axes);
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
          Tensor out = Tensor::zeros(s);
          const float* px = xd.data<float>();
          const float* pm = md.data<float>();
          const float* pg = g[0].data<float>();
          float* po = out.data<float>();
#pragma omp parallel for if (xd.numel() > detail::kParallelGrainMemory)
          for (std::int64_t o = 0; o < outer; ++o)
            for (std::int64_t i = 0; i < inner; ++i) {
              const float m = pm[o * inner + i];
              for (std::int64_t j = 0; j < r; ++j) {
                const std::int64_t at = (o * r + j) * inner + i;
                if (px[at] == m) {
                  po[at] = pg[o * inner + i];
                  break;
                }
              }
            }
          return std::vector<Tensor>{out};
        }
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
