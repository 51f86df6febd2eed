// CUDA kernels: elementwise maps of f32 tensors (unary ops and their derivatives,
// broadcasting binary ops, selection). The unary ops' functors are the CPU's
// (tensor/detail/unary_math.hpp: one source for both devices, the same bits).
#include <cstdint>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/halves.cuh"
#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/launch.cuh"
#include "distjax/tensor/detail/unary_math.hpp"

namespace distjax::tensor::cuda {
namespace {

using detail::BinaryOp;
using detail::BroadcastPlan;
using detail::UnaryOp;
using detail::unary_math::with_unary;
using K = BroadcastPlan::Kind;

// ---------------------------------------------------------------- the map kernel
// Every map here reads some f32 streams at i and writes out[i]; Map functors take the
// index so that broadcast operands can compute theirs. With kVec the streams are 16-byte
// aligned and each thread maps float4s (4 consecutive i), the tail scalar.

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// out[i] = m(i) for i < n, where m(i) gives one float and m.vec(j) the float4 of
// i = 4j..4j+3. Bound: the bytes of m's streams plus 4 written per element. On an H200, with
// 128 Mi elements: 3.6 TB/s for gelu (tanh form), 3.75 TB/s for a Same x Same binary op,
// 3.95 TB/s with a row or a column operand (counting the full operand and out only), 4.2
// TB/s for select; General x General operands 1.5 TB/s counting out alone.
// Stores of map_kernel's results: f32 as they are; bf16 rounded as distjax::bf16(float)
// does (4 values as one 8-byte store).
__device__ inline void store4(float* out, std::int64_t j, float4 v) {
  reinterpret_cast<float4*>(out)[j] = v;
}
__device__ inline void store4(Bf16* out, std::int64_t j, float4 v) {
  store_bf16x4(out, j, v.x, v.y, v.z, v.w);
}
__device__ inline void store1(float* out, std::int64_t i, float v) { out[i] = v; }
__device__ inline void store1(Bf16* out, std::int64_t i, float v) { out[i] = bf16_from_f32(v); }

// out[i] = m(i) for i < n, where m(i) gives one float and m.vec(j) the float4 of
// i = 4j..4j+3; Out is f32 or bf16. Bound: the bytes of m's streams plus those written per
// element. On an H200, with 128 Mi elements and f32 out: 3.6 TB/s for gelu (tanh form), 3.75
// TB/s for a Same x Same binary op, 3.95 TB/s with a row or a column operand (counting the
// full operand and out only), 4.2 TB/s for select; General x General operands 1.5 TB/s
// counting out alone.
template <class M, class Out>
__global__ void map_kernel(M m, Out* __restrict__ out, std::int64_t n, bool vec) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t head = 0;
  if (vec) {
    const std::int64_t n4 = n / 4;
    for (std::int64_t j = t; j < n4; j += stride)
      store4(out, j, m.vec(j));
    head = n4 * 4;
  }
  for (std::int64_t i = head + t; i < n; i += stride)
    store1(out, i, m(i));
}

template <class M, class Out>
void launch_map(const M& m, Out* out, std::int64_t n, bool vec, cudaStream_t stream,
                const char* op) {
  map_kernel<M, Out><<<grid_for(vec ? n / 4 + 1 : n), kThreads, 0, stream>>>(m, out, n, vec);
  DISTJAX_CUDA_LAUNCHED(op);
}

__device__ inline float4 load4(const float* p, std::int64_t j) {
  return reinterpret_cast<const float4*>(p)[j];
}

template <class U>
struct UnaryMap {
  U u;
  const float* x;
  __device__ float operator()(std::int64_t i) const { return u.f(x[i]); }
  __device__ float4 vec(std::int64_t j) const {
    const float4 v = load4(x, j);
    return {u.f(v.x), u.f(v.y), u.f(v.z), u.f(v.w)};
  }
};

template <class U>
struct GradMap {
  U u;
  const float *g, *x, *y;
  __device__ float operator()(std::int64_t i) const { return g[i] * u.df(x[i], y[i]); }
  __device__ float4 vec(std::int64_t j) const {
    const float4 a = load4(g, j), b = load4(x, j), c = load4(y, j);
    return {a.x * u.df(b.x, c.x), a.y * u.df(b.y, c.y), a.z * u.df(b.z, c.z), a.w * u.df(b.w, c.w)};
  }
};

[[noreturn]] void unknown_op(const char* kernel, UnaryOp op) {
  DISTJAX_THROW(InvalidArgument, "[", kernel, "] unknown op code ", static_cast<int>(op));
}

void unary(UnaryOp op, const float* x, float* out, std::int64_t n, float c) {
  if (n <= 0) return;
  const bool vec = aligned16(x) && aligned16(out);
  const bool known = with_unary(op, c, [&](auto u) {
    launch_map(UnaryMap<decltype(u)>{u, x}, out, n, vec, thread_stream(), "unary");
  });
  if (!known) unknown_op("unary", op);
}

void unary_bf16(UnaryOp op, const float* x, bf16* out, std::int64_t n, float c) {
  if (n <= 0) return;
  const bool vec = aligned16(x) && reinterpret_cast<std::uintptr_t>(out) % 8 == 0;
  auto* o = reinterpret_cast<Bf16*>(out);
  const bool known = with_unary(op, c, [&](auto u) {
    launch_map(UnaryMap<decltype(u)>{u, x}, o, n, vec, thread_stream(), "unary");
  });
  if (!known) unknown_op("unary", op);
}

void unary_grad(UnaryOp op, const float* g, const float* x, const float* y, float* out,
                std::int64_t n, float c) {
  const bool known = with_unary(op, c, [&](auto u) {
    if constexpr (requires { u.df(0.f, 0.f); }) {
      if (n <= 0) return;
      const bool vec = aligned16(g) && aligned16(x) && aligned16(y) && aligned16(out);
      launch_map(GradMap<decltype(u)>{u, g, x, y}, out, n, vec, thread_stream(), "unary_grad");
    } else {
      DISTJAX_THROW(Error, "[unary_grad] op code ", static_cast<int>(op),
                    " has no derivative kernel");
    }
  });
  if (!known) unknown_op("unary_grad", op);
}

// ---------------------------------------------------------------- binary ops
// An operand broadcast to the output, by kind; K::General indexes through the plan's dims
// and strides after merging the dimensions it can (merge_dims). Loads of Row and Col
// operands are cached reads of a small vector.

// Flat index into a General operand for output index i, in index type I (32 bits when every
// index fits: a 64-bit division costs several times a 32-bit one).
template <class I>
struct GeneralIndex {
  int rank;
  I dims[detail::kMaxKernelRank];
  I strides[detail::kMaxKernelRank];
  __device__ I operator()(I i) const {
    I idx = 0;
    for (int d = rank - 1; d > 0; --d) {
      const I q = i / dims[d];
      idx += (i - q * dims[d]) * strides[d];
      i = q;
    }
    return idx + i * strides[0];
  }
};

// The plan's dimensions with those of size 1 dropped and neighbours merged where the operand
// walks them as one (stride[d] == stride[d + 1] * dims[d + 1], broadcast pairs included).
template <class I>
GeneralIndex<I> merge_dims(const BroadcastPlan& q) {
  GeneralIndex<I> g{};
  g.rank = 0;
  for (int d = 0; d < q.rank; ++d) {
    if (q.dims[d] == 1) continue;
    if (g.rank > 0 &&
        static_cast<std::int64_t>(g.strides[g.rank - 1]) == q.strides[d] * q.dims[d]) {
      g.dims[g.rank - 1] =
          static_cast<I>(static_cast<std::int64_t>(g.dims[g.rank - 1]) * q.dims[d]);
      g.strides[g.rank - 1] = static_cast<I>(q.strides[d]);
    } else {
      g.dims[g.rank] = static_cast<I>(q.dims[d]);
      g.strides[g.rank] = static_cast<I>(q.strides[d]);
      ++g.rank;
    }
  }
  if (g.rank == 0) {  // one element
    g.rank = 1;
    g.dims[0] = 1;
    g.strides[0] = 0;
  }
  return g;
}

// An operand of any kind, loaded at output index i (the kind is uniform across the grid,
// so its switch does not diverge).
template <class I>
struct Operand {
  const float* p;
  K kind;
  I inner;
  GeneralIndex<I> general;
  __device__ float operator()(std::int64_t i64) const {
    const I i = static_cast<I>(i64);
    switch (kind) {
      case K::Same:
        return p[i];
      case K::Scalar:
        return p[0];
      case K::Row:
        return p[i % inner];
      case K::Col:
        return p[i / inner];
      default:
        return p[general(i)];
    }
  }
};

template <class I>
Operand<I> operand_of(const float* p, const BroadcastPlan& q) {
  Operand<I> o{};
  o.p = p;
  o.kind = q.kind;
  o.inner = static_cast<I>(q.inner);
  if (q.kind == K::General) o.general = merge_dims<I>(q);
  return o;
}

// Same-shaped operands, or one of them a scalar (kScalarA, kScalarB): float4 both sides.
template <class F, bool kScalarA, bool kScalarB>
struct SameMap {
  F f;
  const float *a, *b;
  __device__ float operator()(std::int64_t i) const {
    return f(kScalarA ? a[0] : a[i], kScalarB ? b[0] : b[i]);
  }
  __device__ float4 vec(std::int64_t j) const {
    const float4 x = kScalarA ? make_float4(a[0], a[0], a[0], a[0]) : load4(a, j);
    const float4 y = kScalarB ? make_float4(b[0], b[0], b[0], b[0]) : load4(b, j);
    return {f(x.x, y.x), f(x.y, y.y), f(x.z, y.z), f(x.w, y.w)};
  }
};

// One operand full, the other a row (kCol false: element i % inner) or a column (kCol:
// element i / inner) of it; kSmallA says which of a and b is the small one. float4 when
// inner is a multiple of 4 (then a float4 of out lies in one row).
template <class F, bool kCol, bool kSmallA>
struct RowColMap {
  F f;
  const float *a, *b;
  std::int64_t inner;
  __device__ float small_at(const float* p, std::int64_t i) const {
    return kCol ? p[i / inner] : p[i % inner];
  }
  __device__ float operator()(std::int64_t i) const {
    return kSmallA ? f(small_at(a, i), b[i]) : f(a[i], small_at(b, i));
  }
  __device__ float4 vec(std::int64_t j) const {
    const std::int64_t i = 4 * j;
    float4 s;
    if (kCol) {
      const float v = (kSmallA ? a : b)[i / inner];
      s = make_float4(v, v, v, v);
    } else {
      s = load4(kSmallA ? a : b, (i % inner) / 4);
    }
    const float4 v = load4(kSmallA ? b : a, j);
    return kSmallA ? float4{f(s.x, v.x), f(s.y, v.y), f(s.z, v.z), f(s.w, v.w)}
                   : float4{f(v.x, s.x), f(v.y, s.y), f(v.z, s.z), f(v.w, s.w)};
  }
};

// Any two kinds, scalar loads.
template <class F, class I>
struct AnyMap {
  F f;
  Operand<I> a, b;
  __device__ float operator()(std::int64_t i) const { return f(a(i), b(i)); }
  __device__ float4 vec(std::int64_t) const { return {}; }  // never called (vec is false)
};

template <class F>
void broadcast_binary(const float* a, const BroadcastPlan& qa, const float* b,
                      const BroadcastPlan& qb, float* out, std::int64_t n, F f,
                      cudaStream_t stream) {
  const bool al = aligned16(a) && aligned16(b) && aligned16(out);
  const K ka = qa.kind, kb = qb.kind;
  if (ka == K::Same && kb == K::Same)
    return launch_map(SameMap<F, false, false>{f, a, b}, out, n, al, stream, "binary");
  if (ka == K::Same && kb == K::Scalar)
    return launch_map(SameMap<F, false, true>{f, a, b}, out, n, aligned16(a) && aligned16(out),
                      stream, "binary");
  if (ka == K::Scalar && kb == K::Same)
    return launch_map(SameMap<F, true, false>{f, a, b}, out, n, aligned16(b) && aligned16(out),
                      stream, "binary");
  if ((ka == K::Same && (kb == K::Row || kb == K::Col)) ||
      (kb == K::Same && (ka == K::Row || ka == K::Col))) {
    const bool small_a = ka != K::Same;
    const std::int64_t inner = small_a ? qa.inner : qb.inner;
    const bool vec = al && inner % 4 == 0;
    if ((small_a ? ka : kb) == K::Row) {
      if (small_a)
        return launch_map(RowColMap<F, false, true>{f, a, b, inner}, out, n, vec, stream, "binary");
      return launch_map(RowColMap<F, false, false>{f, a, b, inner}, out, n, vec, stream, "binary");
    }
    if (small_a)
      return launch_map(RowColMap<F, true, true>{f, a, b, inner}, out, n, vec, stream, "binary");
    return launch_map(RowColMap<F, true, false>{f, a, b, inner}, out, n, vec, stream, "binary");
  }
  if (n <= INT32_MAX)
    return launch_map(AnyMap<F, std::uint32_t>{f, operand_of<std::uint32_t>(a, qa),
                                               operand_of<std::uint32_t>(b, qb)},
                      out, n, false, stream, "binary");
  launch_map(AnyMap<F, std::uint64_t>{f, operand_of<std::uint64_t>(a, qa),
                                      operand_of<std::uint64_t>(b, qb)},
             out, n, false, stream, "binary");
}

struct AddF {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct SubF {
  __device__ float operator()(float x, float y) const { return x - y; }
};
struct MulF {
  __device__ float operator()(float x, float y) const { return x * y; }
};
struct DivF {
  __device__ float operator()(float x, float y) const { return x / y; }
};
struct MaximumF {
  __device__ float operator()(float x, float y) const { return x >= y ? x : y; }
};
struct GreaterEqualF {
  __device__ float operator()(float x, float y) const { return x >= y ? 1.f : 0.f; }
};

void binary(BinaryOp op, const float* a, const BroadcastPlan& qa, const float* b,
            const BroadcastPlan& qb, float* out, std::int64_t n) {
  if (n <= 0) return;
  const cudaStream_t stream = thread_stream();
  switch (op) {
    case BinaryOp::Add:
      return broadcast_binary(a, qa, b, qb, out, n, AddF{}, stream);
    case BinaryOp::Sub:
      return broadcast_binary(a, qa, b, qb, out, n, SubF{}, stream);
    case BinaryOp::Mul:
      return broadcast_binary(a, qa, b, qb, out, n, MulF{}, stream);
    case BinaryOp::Div:
      return broadcast_binary(a, qa, b, qb, out, n, DivF{}, stream);
    case BinaryOp::Maximum:
      return broadcast_binary(a, qa, b, qb, out, n, MaximumF{}, stream);
    case BinaryOp::GreaterEqual:
      return broadcast_binary(a, qa, b, qb, out, n, GreaterEqualF{}, stream);
  }
  DISTJAX_THROW(InvalidArgument, "[binary] unknown op code ", static_cast<int>(op));
}

// ---------------------------------------------------------------- select

struct SelectMap {
  const float *m, *a, *b;
  __device__ float operator()(std::int64_t i) const { return m[i] != 0.f ? a[i] : b[i]; }
  __device__ float4 vec(std::int64_t j) const {
    const float4 k = load4(m, j), x = load4(a, j), y = load4(b, j);
    return {k.x != 0.f ? x.x : y.x, k.y != 0.f ? x.y : y.y, k.z != 0.f ? x.z : y.z,
            k.w != 0.f ? x.w : y.w};
  }
};

void select(const float* m, const float* a, const float* b, float* out, std::int64_t n) {
  if (n <= 0) return;
  const bool vec = aligned16(m) && aligned16(a) && aligned16(b) && aligned16(out);
  launch_map(SelectMap{m, a, b}, out, n, vec, thread_stream(), "select");
}

}  // namespace

const detail::ElementwiseKernels elementwise_kernels{
    .unary = unary,
    .unary_bf16 = unary_bf16,
    .unary_grad = unary_grad,
    .binary = binary,
    .select = select,
};

}  // namespace distjax::tensor::cuda
