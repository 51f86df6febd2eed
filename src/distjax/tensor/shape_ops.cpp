#include "distjax/tensor/shape_ops.hpp"

#include <numeric>

#include "distjax/tensor/detail/kernels.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {
namespace {

std::vector<int> inverse_perm(const std::vector<int>& p) {
  std::vector<int> inv(p.size());
  for (std::size_t i = 0; i < p.size(); ++i)
    inv[p[i]] = static_cast<int>(i);
  return inv;
}

using detail::Dispatch;
using detail::KernelTable;

// Copies `outer` runs of `bytes` bytes from src (runs src_row bytes apart) to dst (runs
// dst_row bytes apart), src and dst in the memory of `from` and `to`: the shared step of
// slice, concat and split.
void copy_block(const char* op, const Tensor& from, const char* src, std::int64_t src_row,
                const Tensor& to, char* dst, std::int64_t dst_row, std::int64_t outer,
                std::int64_t bytes) {
  Dispatch k(op, &KernelTable::copy, {&from, &to});
  k->copy_2d(src, static_cast<std::size_t>(src_row), dst, static_cast<std::size_t>(dst_row),
             static_cast<std::size_t>(bytes), outer);
}

std::pair<std::int64_t, std::int64_t> outer_inner(const Shape& s, int axis) {
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i)
    outer *= s[i];
  for (int i = axis + 1; i < static_cast<int>(s.size()); ++i)
    inner *= s[i];
  return {outer, inner};
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape_in) {
  check_defined(x, "reshape", "x");
  Shape shape = shape_in;
  int infer = -1;
  std::int64_t known = 1;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (shape[i] == -1) {
      DISTJAX_CHECK(infer < 0, InvalidArgument, "[reshape] more than one -1 in ",
                    to_string(shape_in));
      infer = i;
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    DISTJAX_CHECK(known > 0 && x.numel() % known == 0, InvalidArgument, "[reshape] cannot reshape ",
                  to_string(x.shape()), " to ", to_string(shape_in));
    shape[infer] = x.numel() / known;
  }
  DISTJAX_CHECK(numel(shape) == x.numel(), InvalidArgument, "[reshape] cannot reshape ",
                to_string(x.shape()), " (", x.numel(), " elements) to ", to_string(shape_in));
  Tensor out = x.view(shape);
  if (!needs_grad({&x})) return joined(out, {&x});
  return record("reshape", {x}, out, [xs = x.shape()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].view(xs)};
  });
}

Tensor permute(const Tensor& x, const std::vector<int>& perm) {
  check_defined(x, "permute", "x");
  DISTJAX_CHECK(static_cast<int>(perm.size()) == x.rank(), InvalidArgument,
                "[permute] perm of length ", perm.size(), " for rank ", x.rank());
  std::vector<int> seen(perm.size(), 0);
  for (int p : perm) {
    DISTJAX_CHECK(p >= 0 && p < x.rank() && !seen[p]++, InvalidArgument,
                  "[permute] perm is not a permutation of 0..", x.rank() - 1);
  }
  const int r = x.rank();
  DISTJAX_CHECK(r <= detail::kMaxKernelRank, InvalidArgument, "[permute] rank ", r, " exceeds ",
                detail::kMaxKernelRank);
  detail::PermutePlan plan;
  plan.rank = r;
  const auto in_strides = contiguous_strides(x.shape());
  for (int i = 0; i < r; ++i) {
    plan.dims[i] = x.shape()[perm[i]];
    plan.strides[i] = in_strides[perm[i]];  // input stride for each output dim
  }
  Tensor out = Tensor::empty(Shape(plan.dims, plan.dims + r), x.dtype(), x.device());
  Dispatch k("permute", &KernelTable::shape, {&x, &out});
  k->permute(x.raw_data(), out.raw_data(), dtype_size(x.dtype()), plan, out.numel());
  if (!needs_grad({&x})) return joined(out, {&x});
  return record("permute", {x}, out, [inv = inverse_perm(perm)](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{permute(g[0], inv)};
  });
}

Tensor transpose(const Tensor& x, int d0, int d1) {
  check_defined(x, "transpose", "x");
  std::vector<int> perm(x.rank());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[normalize_axis(d0, x.rank(), "transpose")],
            perm[normalize_axis(d1, x.rank(), "transpose")]);
  return permute(x, perm);
}

Tensor slice(const Tensor& x, int axis_in, std::int64_t start, std::int64_t end) {
  check_defined(x, "slice", "x");
  const int axis = normalize_axis(axis_in, x.rank(), "slice");
  const std::int64_t n = x.size(axis);
  if (start < 0) start += n;
  if (end < 0) end += n;
  DISTJAX_CHECK(0 <= start && start <= end && end <= n, InvalidArgument, "[slice] range [", start,
                ", ", end, ") is outside dimension ", axis, " of ", to_string(x.shape()));
  Shape os = x.shape();
  os[axis] = end - start;
  Tensor out = Tensor::empty(os, x.dtype(), x.device());
  auto [outer, inner] = outer_inner(x.shape(), axis);
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(x.dtype()));
  copy_block("slice", x, static_cast<const char*>(x.raw_data()) + start * inner * es,
             n * inner * es, out, static_cast<char*>(out.raw_data()), (end - start) * inner * es,
             outer, (end - start) * inner * es);
  if (!needs_grad({&x})) return joined(out, {&x});
  return record("slice", {x}, out,
                [xs = x.shape(), axis, start, end](const std::vector<Tensor>& g) {
                  Tensor gx = Tensor::zeros(xs, DType::F32, g[0].device());
                  auto [outer, inner] = outer_inner(xs, axis);
                  copy_block("slice", g[0], static_cast<const char*>(g[0].raw_data()),
                             (end - start) * inner * 4, gx,
                             static_cast<char*>(gx.raw_data()) + start * inner * 4,
                             xs[axis] * inner * 4, outer, (end - start) * inner * 4);
                  return std::vector<Tensor>{gx};
                });
}

Tensor concat(const std::vector<Tensor>& xs, int axis_in) {
  DISTJAX_CHECK(!xs.empty(), InvalidArgument, "[concat] no tensors given");
  const Tensor& x0 = xs[0];
  check_defined(x0, "concat", "input 0");
  const int axis = normalize_axis(axis_in, x0.rank(), "concat");
  Shape os = x0.shape();
  os[axis] = 0;
  std::vector<std::int64_t> sizes;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    check_defined(xs[i], "concat", "an input");
    Shape a = xs[i].shape(), b = x0.shape();
    DISTJAX_CHECK(a.size() == b.size() && xs[i].dtype() == x0.dtype(), InvalidArgument,
                  "[concat] input ", i, " ", to_string(a), " does not match input 0 ",
                  to_string(b));
    a[axis] = b[axis] = 0;
    DISTJAX_CHECK(a == b, InvalidArgument, "[concat] input ", i, " ", to_string(xs[i].shape()),
                  " differs from input 0 ", to_string(x0.shape()), " outside axis ", axis);
    sizes.push_back(xs[i].size(axis));
    os[axis] += xs[i].size(axis);
  }
  Tensor out = Tensor::empty(os, x0.dtype(), x0.device());
  auto [outer, inner] = outer_inner(os, axis);
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(x0.dtype()));
  std::int64_t at = 0;
  for (const Tensor& x : xs) {
    const std::int64_t len = x.size(axis);
    copy_block("concat", x, static_cast<const char*>(x.raw_data()), len * inner * es, out,
               static_cast<char*>(out.raw_data()) + at * inner * es, os[axis] * inner * es, outer,
               len * inner * es);
    at += len;
  }
  if (!needs_grad(xs)) return joined(out, xs);
  return record("concat", xs, out,
                [sizes, axis](const std::vector<Tensor>& g) { return split(g[0], sizes, axis); });
}

std::vector<Tensor> split(const Tensor& x, const std::vector<std::int64_t>& sizes, int axis_in) {
  check_defined(x, "split", "x");
  const int axis = normalize_axis(axis_in, x.rank(), "split");
  std::int64_t total = 0;
  for (auto s : sizes)
    total += s;
  DISTJAX_CHECK(total == x.size(axis), InvalidArgument, "[split] sizes sum to ", total,
                " but dimension ", axis, " of ", to_string(x.shape()), " is ", x.size(axis));
  std::vector<Tensor> outs;
  {
    // One node for all parts: the backward is a single concat instead of one zero-filled
    // full-size cotangent per part summed by the tape.
    NoGradGuard off;
    std::int64_t at = 0;
    for (auto s : sizes) {
      outs.push_back(slice(x, axis, at, at + s));
      at += s;
    }
  }
  if (!needs_grad({&x})) {
    for (Tensor& o : outs)
      o.set_varying_axes(x.varying_axes());
    return outs;
  }
  const Device device = x.device();
  record("split", {x}, outs, [xs = x.shape(), device, sizes, axis](const std::vector<Tensor>& g) {
    std::vector<Tensor> parts;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (g[i].defined()) {
        parts.push_back(g[i]);
      } else {
        Shape ps = xs;
        ps[axis] = sizes[i];
        parts.push_back(Tensor::zeros(ps, DType::F32, device));
      }
    }
    return std::vector<Tensor>{concat(parts, axis)};
  });
  return outs;
}

std::vector<Tensor> split(const Tensor& x, int n, int axis) {
  check_defined(x, "split", "x");
  const int a = normalize_axis(axis, x.rank(), "split");
  DISTJAX_CHECK(n > 0 && x.size(a) % n == 0, InvalidArgument, "[split] dimension ", a, " of ",
                to_string(x.shape()), " does not divide into ", n, " parts");
  return split(x, std::vector<std::int64_t>(n, x.size(a) / n), a);
}

Tensor stack(const std::vector<Tensor>& xs, int axis) {
  DISTJAX_CHECK(!xs.empty(), InvalidArgument, "[stack] no tensors given");
  const int a = normalize_axis(axis, xs[0].rank() + 1, "stack");
  std::vector<Tensor> expanded;
  for (const Tensor& x : xs) {
    DISTJAX_CHECK(x.defined() && x.shape() == xs[0].shape(), InvalidArgument,
                  "[stack] shapes differ: ", x.defined() ? to_string(x.shape()) : "undefined",
                  " vs ", to_string(xs[0].shape()));
    Shape s = x.shape();
    s.insert(s.begin() + a, 1);
    expanded.push_back(reshape(x, s));
  }
  return concat(expanded, a);
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  detail::require_f32("broadcast_to", {&x});
  DISTJAX_CHECK(broadcast_shapes(x.shape(), shape, "broadcast_to") == shape, InvalidArgument,
                "[broadcast_to] cannot broadcast ", to_string(x.shape()), " to ", to_string(shape));
  if (x.shape() == shape) return x;
  Tensor out = Tensor::empty(shape, DType::F32, x.device());
  detail::broadcast_copy("broadcast_to", x, out);
  if (!needs_grad({&x})) return joined(out, {&x});
  return record("broadcast_to", {x}, out, [xs = x.shape()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to(g[0], xs)};
  });
}

Tensor gather_rows(const Tensor& x, const std::vector<std::int64_t>& indices) {
  DISTJAX_CHECK(x.defined() && x.rank() >= 1, InvalidArgument,
                "[gather_rows] expected a tensor with a row dimension");
  const std::int64_t n = x.size(0);
  Shape shape = x.shape();
  shape[0] = static_cast<std::int64_t>(indices.size());
  for (const std::int64_t r : indices)
    DISTJAX_CHECK(0 <= r && r < n, InvalidArgument, "[gather_rows] index ", r, " out of range for ",
                  n, " rows");
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const Tensor rows =
      Tensor::from_vector(indices, {static_cast<std::int64_t>(indices.size())}, x.device());
  const std::size_t row_bytes = n == 0 ? 0 : x.nbytes() / static_cast<std::size_t>(n);
  Dispatch k("gather_rows", &KernelTable::gather, {&x, &rows, &out});
  k->gather_rows(x.raw_data(), row_bytes, rows.data<std::int64_t>(), rows.numel(), out.raw_data());
  return out;
}

}  // namespace distjax::tensor
