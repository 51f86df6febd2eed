// CPU kernels: elementwise maps (unary ops and their derivatives, broadcasting binary
// ops, selection). Each op's forward and derivative sit together in one functor; a switch
// on the op code outside the loop instantiates the loop per op.
#include <cmath>
#include <type_traits>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cpu/grain.hpp"
#include "distjax/tensor/cpu/kernels.hpp"
#include "distjax/tensor/detail/unary_math.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

// ---------------------------------------------------------------- unary ops
// The ops' functors and the math they share with the GPU are tensor/detail/unary_math.hpp's.

using unary_math::with_unary;

// A loop over n elements splits over threads past this many: fewer for transcendental f.
template <class U>
constexpr std::int64_t kGrain = U::kCheap ? kParallelGrainMemory : kParallelGrain;

// Out: f32, or bf16 (each value rounded as it is stored).
template <class U, class Out>
void map_unary(U u, const float* px, Out* po, std::int64_t n) {
#pragma omp parallel for simd if (parallel : n > kGrain <U>)
  for (std::int64_t i = 0; i < n; ++i)
    po[i] = Out(u.f(px[i]));
}

// grad * f'(x, y) elementwise; py null (an op whose derivative reads only x): not read.
template <class U>
void map_grad(U u, const float* pg, const float* px, const float* py, float* po, std::int64_t n) {
  if (py == nullptr) {
#pragma omp parallel for simd if (parallel : n > kGrain <U>)
    for (std::int64_t i = 0; i < n; ++i)
      po[i] = pg[i] * u.df(px[i], 0.f);
    return;
  }
#pragma omp parallel for simd if (parallel : n > kGrain <U>)
  for (std::int64_t i = 0; i < n; ++i)
    po[i] = pg[i] * u.df(px[i], py[i]);
}

[[noreturn]] void unknown_op(const char* kernel, UnaryOp op) {
  DISTJAX_THROW(InvalidArgument, "[", kernel, "] unknown op code ", static_cast<int>(op));
}

void unary(UnaryOp op, const float* x, float* out, std::int64_t n, float c) {
  if (!with_unary(op, c, [&](auto u) { map_unary(u, x, out, n); })) unknown_op("unary", op);
}

void unary_bf16(UnaryOp op, const float* x, bf16* out, std::int64_t n, float c) {
  if (!with_unary(op, c, [&](auto u) { map_unary(u, x, out, n); })) unknown_op("unary", op);
}

void unary_grad(UnaryOp op, const float* g, const float* x, const float* y, float* out,
                std::int64_t n, float c) {
  const bool known = with_unary(op, c, [&](auto u) {
    if constexpr (requires { u.df(0.f, 0.f); })
      map_grad(u, g, x, y, out, n);
    else
      DISTJAX_THROW(Error, "[unary_grad] op code ", static_cast<int>(op),
                    " has no derivative kernel");
  });
  if (!known) unknown_op("unary_grad", op);
}

// ---------------------------------------------------------------- binary ops

// out[i] = f(a[ia], b[ib]) with a and b broadcast to out by their plans.
template <class F>
void broadcast_binary(const float* pa, const BroadcastPlan& qa, const float* pb,
                      const BroadcastPlan& qb, float* po, std::int64_t n, F f) {
  using K = BroadcastPlan::Kind;
  auto load = [&](const float* p, const BroadcastPlan& q, std::int64_t i) {
    switch (q.kind) {
      case K::Same:
        return p[i];
      case K::Scalar:
        return p[0];
      case K::Row:
        return p[i % q.inner];
      case K::Col:
        return p[i / q.inner];
      default:
        return p[broadcast_index(q, i)];
    }
  };
  // Fast paths: the operand layouts that dominate training (bias rows, per-row scales,
  // scalars) on either side; everything else goes through general indexing.
  if (qa.kind == K::Same && qb.kind == K::Same) {
#pragma omp parallel for simd if (parallel : n > kParallelGrainMemory)
    for (std::int64_t i = 0; i < n; ++i)
      po[i] = f(pa[i], pb[i]);
  } else if (qa.kind == K::Same && qb.kind == K::Scalar) {
    const float s = pb[0];
#pragma omp parallel for simd if (parallel : n > kParallelGrainMemory)
    for (std::int64_t i = 0; i < n; ++i)
      po[i] = f(pa[i], s);
  } else if (qa.kind == K::Scalar && qb.kind == K::Same) {
    const float s = pa[0];
#pragma omp parallel for simd if (parallel : n > kParallelGrainMemory)
    for (std::int64_t i = 0; i < n; ++i)
      po[i] = f(s, pb[i]);
  } else if ((qa.kind == K::Same && qb.kind == K::Row) ||
             (qa.kind == K::Row && qb.kind == K::Same)) {
    const bool a_row = qa.kind == K::Row;
    const std::int64_t inner = a_row ? qa.inner : qb.inner, rows = n / inner;
#pragma omp parallel for if (n > kParallelGrainMemory)
    for (std::int64_t r = 0; r < rows; ++r) {
      float* orow = po + r * inner;
      if (a_row) {
        const float* br = pb + r * inner;
#pragma omp simd
        for (std::int64_t c = 0; c < inner; ++c)
          orow[c] = f(pa[c], br[c]);
      } else {
        const float* ar = pa + r * inner;
#pragma omp simd
        for (std::int64_t c = 0; c < inner; ++c)
          orow[c] = f(ar[c], pb[c]);
      }
    }
  } else if ((qa.kind == K::Same && qb.kind == K::Col) ||
             (qa.kind == K::Col && qb.kind == K::Same)) {
    const bool a_col = qa.kind == K::Col;
    const std::int64_t inner = a_col ? qa.inner : qb.inner, rows = n / inner;
#pragma omp parallel for if (n > kParallelGrainMemory)
    for (std::int64_t r = 0; r < rows; ++r) {
      float* orow = po + r * inner;
      if (a_col) {
        const float s = pa[r];
        const float* br = pb + r * inner;
#pragma omp simd
        for (std::int64_t c = 0; c < inner; ++c)
          orow[c] = f(s, br[c]);
      } else {
        const float s = pb[r];
        const float* ar = pa + r * inner;
#pragma omp simd
        for (std::int64_t c = 0; c < inner; ++c)
          orow[c] = f(ar[c], s);
      }
    }
  } else {
#pragma omp parallel for if (n > kParallelGrainMemory)
    for (std::int64_t i = 0; i < n; ++i)
      po[i] = f(load(pa, qa, i), load(pb, qb, i));
  }
}

void binary(BinaryOp op, const float* a, const BroadcastPlan& qa, const float* b,
            const BroadcastPlan& qb, float* out, std::int64_t n) {
  switch (op) {
    case BinaryOp::Add:
      return broadcast_binary(a, qa, b, qb, out, n, [](float x, float y) { return x + y; });
    case BinaryOp::Sub:
      return broadcast_binary(a, qa, b, qb, out, n, [](float x, float y) { return x - y; });
    case BinaryOp::Mul:
      return broadcast_binary(a, qa, b, qb, out, n, [](float x, float y) { return x * y; });
    case BinaryOp::Div:
      return broadcast_binary(a, qa, b, qb, out, n, [](float x, float y) { return x / y; });
    case BinaryOp::Maximum:
      return broadcast_binary(a, qa, b, qb, out, n,
                              [](float x, float y) { return x >= y ? x : y; });
    case BinaryOp::GreaterEqual:
      return broadcast_binary(a, qa, b, qb, out, n,
                              [](float x, float y) { return x >= y ? 1.f : 0.f; });
  }
}

void select(const float* pm, const float* pa, const float* pb, float* po, std::int64_t n) {
#pragma omp parallel for simd if (parallel : n > kParallelGrainMemory)
  for (std::int64_t i = 0; i < n; ++i) {
    // Both loads unconditional: clang vectorises a select, not a conditional load.
    const float x = pa[i], y = pb[i];
    po[i] = pm[i] != 0.f ? x : y;
  }
}

}  // namespace

const ElementwiseKernels elementwise_kernels{
    .unary = unary,
    .unary_bf16 = unary_bf16,
    .unary_grad = unary_grad,
    .binary = binary,
    .select = select,
};

}  // namespace distjax::tensor::detail::cpu
