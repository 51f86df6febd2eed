#include "distjax/tensor/detail/kernels.hpp"

#include <algorithm>
#include <cstring>

namespace distjax::tensor::detail {

void require_cpu(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    DISTJAX_CHECK(t->device().kind == DeviceKind::CPU, NotImplemented, "[", op,
                  "] has no kernel for device ", t->device().str(), " in this build");
}

void require_f32(const char* op, std::initializer_list<const Tensor*> ts) {
  int i = 0;
  for (const Tensor* t : ts) {
    DISTJAX_CHECK(t->defined(), InvalidArgument, "[", op, "] operand ", i, " is undefined");
    DISTJAX_CHECK(t->dtype() == DType::F32, InvalidArgument, "[", op, "] operand ", i,
                  " has dtype ", dtype_name(t->dtype()),
                  "; compute is f32 (use astype to convert bf16/f16 storage)");
    ++i;
  }
  require_cpu(op, ts);
}

BroadcastPlan plan_broadcast(const Shape& s, const Shape& out) {
  using K = BroadcastPlan::Kind;
  if (s == out) return {K::Same};
  if (numel(s) == 1) return {K::Scalar};
  if (numel(out) == 0) return {K::General};  // nothing to compute; avoids 0 / 0 below
  // Strip leading ones; a row operand matches a suffix of out, a column operand is a
  // prefix of out followed by ones.
  std::size_t lead = 0;
  while (lead < s.size() && s[lead] == 1)
    ++lead;
  Shape core(s.begin() + lead, s.end());
  if (core.size() <= out.size() && std::equal(core.begin(), core.end(), out.end() - core.size()))
    return {K::Row, numel(out) / numel(core), numel(core)};
  std::size_t trail = s.size();
  while (trail > 0 && s[trail - 1] == 1)
    --trail;
  bool prefix = s.size() == out.size();
  for (std::size_t i = 0; prefix && i < trail; ++i)
    prefix = s[i] == out[i];
  if (prefix) {
    std::int64_t outer = 1;
    for (std::size_t i = 0; i < trail; ++i)
      outer *= out[i];
    return {K::Col, outer, numel(out) / outer};
  }
  return {K::General};
}

std::int64_t broadcast_index(const Shape& s, const Shape& out, std::int64_t i) {
  std::int64_t idx = 0, stride = 1;
  const std::size_t off = out.size() - s.size();
  for (int d = static_cast<int>(out.size()) - 1; d >= 0; --d) {
    const std::int64_t coord = i % out[d];
    i /= out[d];
    if (d >= static_cast<int>(off)) {
      const std::int64_t sd = s[d - off];
      if (sd != 1) idx += coord * stride;
      stride *= sd;
    }
  }
  return idx;
}

void broadcast_copy(const Tensor& x, Tensor& out) {
  using K = BroadcastPlan::Kind;
  const float* px = x.data<float>();
  float* po = out.data<float>();
  const std::int64_t n = out.numel();
  const BroadcastPlan q = plan_broadcast(x.shape(), out.shape());
  switch (q.kind) {
    case K::Same:
      std::memcpy(po, px, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case K::Scalar:
      std::fill(po, po + n, px[0]);
      return;
    case K::Row:
#pragma omp parallel for if (n > kParallelGrainMemory)
      for (std::int64_t r = 0; r < q.outer; ++r)
        std::memcpy(po + r * q.inner, px, static_cast<std::size_t>(q.inner) * sizeof(float));
      return;
    case K::Col:
#pragma omp parallel for if (n > kParallelGrainMemory)
      for (std::int64_t r = 0; r < q.outer; ++r)
        std::fill(po + r * q.inner, po + (r + 1) * q.inner, px[r]);
      return;
    default: {
      // General: per run of the output's last dimension, either a row copy (the operand
      // keeps that dimension) or a fill (it broadcasts it).
      const std::int64_t last = out.shape().empty() ? 1 : out.shape().back();
      const bool keeps_last = !x.shape().empty() && x.shape().back() == last && last != 1;
      const std::int64_t rows = last ? n / last : 0;
#pragma omp parallel for if (n > kParallelGrainMemory)
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t src = broadcast_index(x.shape(), out.shape(), r * last);
        if (keeps_last)
          std::memcpy(po + r * last, px + src, static_cast<std::size_t>(last) * sizeof(float));
        else
          std::fill(po + r * last, po + (r + 1) * last, px[src]);
      }
    }
  }
}

}  // namespace distjax::tensor::detail
