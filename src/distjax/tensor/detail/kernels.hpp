// Private CPU kernel helpers shared by the op files: parallel loops, broadcasting
// binary maps and the device dispatch point.
#pragma once

#include <cstdint>

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor::detail {

/// Elements below which a compute-heavy loop (exp, tanh, erf per element; attention
/// heads) runs on one thread.
constexpr std::int64_t kParallelGrain = 32768;
/// Elements below which a loop of a few flops per element (copies, adds, broadcasts,
/// norms, reductions) runs on one thread. Such loops are memory-bound, but while one
/// thread runs them the others only wait: at 2^18 (1 MiB of f32) the GPT benchmark's
/// (B*T, d) activations (2^19 elements: residual adds, layer norms, their gradients) go
/// parallel, which made its steps a few percent faster on 2 idle cores.
/// Below it, a parallel region's fork/join and the risk of stalling for a scheduler
/// time slice when the cores are shared with other processes outweigh the gain.
constexpr std::int64_t kParallelGrainMemory = std::int64_t(1) << 18;

/// Throws NotImplemented unless every tensor lives on the CPU: the single place where a
/// CUDA backend will branch off.
void require_cpu(const char* op, std::initializer_list<const Tensor*> ts);

/// Requires defined f32 tensors on a supported device, naming the op.
void require_f32(const char* op, std::initializer_list<const Tensor*> ts);

/// out[i] = f(a[ia], b[ib]) with NumPy broadcasting of a and b to out's shape.
template <class F>
void broadcast_binary(const Tensor& a, const Tensor& b, Tensor& out, F f);

/// Layout of a broadcast operand against an output shape: the output viewed as
/// (outer, inner) where the operand is either full, a row (inner), a column (outer),
/// a scalar, or needs general indexing.
struct BroadcastPlan {
  enum class Kind { Same, Scalar, Row, Col, General } kind;
  std::int64_t outer = 1, inner = 1;
};
BroadcastPlan plan_broadcast(const Shape& operand, const Shape& out);
/// Flat index into `operand` for flat output index `i` (general case).
std::int64_t broadcast_index(const Shape& operand, const Shape& out, std::int64_t i);

/// out = x broadcast to out's shape (both f32): row copies, fills and strided runs
/// rather than per-element index arithmetic.
void broadcast_copy(const Tensor& x, Tensor& out);

template <class F>
void broadcast_binary(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  const std::int64_t n = out.numel();
  const BroadcastPlan qa = plan_broadcast(a.shape(), out.shape());
  const BroadcastPlan qb = plan_broadcast(b.shape(), out.shape());
  using K = BroadcastPlan::Kind;
  auto load = [&](const float* p, const BroadcastPlan& q, const Shape& s, std::int64_t i) {
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
        return p[broadcast_index(s, out.shape(), i)];
    }
  };
  // Fast paths: the operand layouts that dominate training (bias rows, per-row scales,
  // scalars) on either side; everything else goes through general indexing.
  if (qa.kind == K::Same && qb.kind == K::Same) {
#pragma omp parallel for simd if (parallel: n > kParallelGrainMemory)
    for (std::int64_t i = 0; i < n; ++i)
      po[i] = f(pa[i], pb[i]);
  } else if (qa.kind == K::Same && qb.kind == K::Scalar) {
    const float s = pb[0];
#pragma omp parallel for simd if (parallel: n > kParallelGrainMemory)
    for (std::int64_t i = 0; i < n; ++i)
      po[i] = f(pa[i], s);
  } else if (qa.kind == K::Scalar && qb.kind == K::Same) {
    const float s = pa[0];
#pragma omp parallel for simd if (parallel: n > kParallelGrainMemory)
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
      po[i] = f(load(pa, qa, a.shape(), i), load(pb, qb, b.shape(), i));
  }
}

}  // namespace distjax::tensor::detail
