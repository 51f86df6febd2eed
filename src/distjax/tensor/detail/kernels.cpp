#include "distjax/tensor/detail/kernels.hpp"

#include <algorithm>

#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::detail {

void require_f32(const char* op, std::initializer_list<const Tensor*> ts) {
  int i = 0;
  for (const Tensor* t : ts) {
    DISTJAX_CHECK(t->defined(), InvalidArgument, "[", op, "] operand ", i, " is undefined");
    DISTJAX_CHECK(t->dtype() == DType::F32, InvalidArgument, "[", op, "] operand ", i,
                  " has dtype ", dtype_name(t->dtype()),
                  "; compute is f32 (use astype to convert bf16/f16 storage)");
    ++i;
  }
}

namespace {

BroadcastPlan::Kind broadcast_kind(const Shape& s, const Shape& out, std::int64_t& outer,
                                   std::int64_t& inner) {
  using K = BroadcastPlan::Kind;
  if (s == out) return K::Same;
  if (numel(s) == 1) return K::Scalar;
  if (numel(out) == 0) return K::General;  // nothing to compute; avoids 0 / 0 below
  // Strip leading ones; a row operand matches a suffix of out, a column operand is a
  // prefix of out followed by ones.
  std::size_t lead = 0;
  while (lead < s.size() && s[lead] == 1)
    ++lead;
  Shape core(s.begin() + lead, s.end());
  if (core.size() <= out.size() && std::equal(core.begin(), core.end(), out.end() - core.size())) {
    outer = numel(out) / numel(core);
    inner = numel(core);
    return K::Row;
  }
  std::size_t trail = s.size();
  while (trail > 0 && s[trail - 1] == 1)
    --trail;
  bool prefix = s.size() == out.size();
  for (std::size_t i = 0; prefix && i < trail; ++i)
    prefix = s[i] == out[i];
  if (prefix) {
    outer = 1;
    for (std::size_t i = 0; i < trail; ++i)
      outer *= out[i];
    inner = numel(out) / outer;
    return K::Col;
  }
  return K::General;
}

}  // namespace

BroadcastPlan plan_broadcast(const Shape& s, const Shape& out, const char* op) {
  DISTJAX_CHECK(out.size() <= static_cast<std::size_t>(kMaxKernelRank) && s.size() <= out.size(),
                InvalidArgument, "[", op, "] cannot broadcast ", to_string(s), " to ",
                to_string(out), " (ranks up to ", kMaxKernelRank, ")");
  BroadcastPlan q;
  q.kind = broadcast_kind(s, out, q.outer, q.inner);
  q.rank = static_cast<int>(out.size());
  const std::size_t off = out.size() - s.size();
  std::int64_t stride = 1;
  for (int d = q.rank - 1; d >= 0; --d) {
    q.dims[d] = out[d];
    if (d >= static_cast<int>(off)) {
      const std::int64_t sd = s[d - off];
      q.strides[d] = sd != 1 ? stride : 0;
      stride *= sd;
    }
  }
  return q;
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

void broadcast_copy(const char* op, const Tensor& x, Tensor& out) {
  const BroadcastPlan q = plan_broadcast(x.shape(), out.shape(), op);
  Dispatch k(op, &KernelTable::shape, {&x, &out});
  k->broadcast(x.data<float>(), q, out.data<float>(), out.numel());
}

}  // namespace distjax::tensor::detail
