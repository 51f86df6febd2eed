// CUDA kernels: permutation and broadcasting copies. A permutation is first reduced to its
// simplest form in bytes (dimensions of size 1 dropped, neighbours the source walks as one
// merged, the widest aligned unit chosen); the source's contiguous dimension then either
// stays innermost (a gather whose reads and writes are both coalesced) or moves (a tiled
// transpose through shared memory).
#include <cstdint>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/launch.cuh"

namespace distjax::tensor::cuda {
namespace {

using detail::BroadcastPlan;
using detail::kMaxKernelRank;
using detail::PermutePlan;
using K = BroadcastPlan::Kind;

// 16-byte unit.
struct alignas(16) U16 {
  std::uint64_t lo, hi;
};

// ---------------------------------------------------------------- permute

// A permutation in units: the output's dimensions (row-major, contiguous) and the source's
// stride per output dimension, in units of the chosen width. One more dimension than a
// PermutePlan: the bytes of an element.
struct UnitPlan {
  int rank = 0;
  std::int64_t dims[kMaxKernelRank + 1] = {};
  std::int64_t strides[kMaxKernelRank + 1] = {};
  std::size_t unit = 1;  // bytes
};

// Appends dimension (dim, stride) to u, merging it into the last one where the source walks
// both as one; size-1 dimensions vanish.
void push_dim(UnitPlan& u, std::int64_t dim, std::int64_t stride) {
  if (dim == 1) return;
  if (u.rank > 0 && u.strides[u.rank - 1] == stride * dim) {
    u.dims[u.rank - 1] *= dim;
    u.strides[u.rank - 1] = stride;
    return;
  }
  u.dims[u.rank] = dim;
  u.strides[u.rank] = stride;
  ++u.rank;
}

// The plan in bytes, merged, then in the widest unit (16, 8, 4, 2 or 1 bytes) that divides
// both addresses, every stride and the innermost run (whose source stride is one byte).
UnitPlan unit_plan(const void* src, void* dst, std::size_t es, const PermutePlan& p) {
  UnitPlan b;
  for (int d = 0; d < p.rank; ++d)
    push_dim(b, p.dims[d], p.strides[d] * static_cast<std::int64_t>(es));
  push_dim(b, static_cast<std::int64_t>(es), 1);
  if (b.rank == 0 || b.strides[b.rank - 1] != 1) {  // es == 1 and the last run moves
    b.dims[b.rank] = 1;
    b.strides[b.rank] = 1;
    ++b.rank;
  }
  std::uint64_t bits = 16 | reinterpret_cast<std::uintptr_t>(src) |
                       reinterpret_cast<std::uintptr_t>(dst) |
                       static_cast<std::uint64_t>(b.dims[b.rank - 1]);
  for (int d = 0; d < b.rank - 1; ++d)
    bits |= static_cast<std::uint64_t>(b.strides[d]);
  const auto w = static_cast<std::int64_t>(bits & (~bits + 1));
  UnitPlan u;
  u.unit = static_cast<std::size_t>(w);
  for (int d = 0; d < b.rank - 1; ++d) {
    u.dims[d] = b.dims[d];
    u.strides[d] = b.strides[d] / w;
  }
  u.rank = b.rank - 1;
  push_dim(u, b.dims[b.rank - 1] / w, 1);
  return u;
}

// The unit plan as the kernels take it, in index type I (32 bits when every index fits).
template <class I>
struct Walk {
  int rank;
  I dims[kMaxKernelRank + 1];
  I strides[kMaxKernelRank + 1];
  // Source offset of output unit i over dimensions [0, end) but `skip`'s.
  __device__ I source(I i, int end, int skip) const {
    I off = 0;
    for (int d = end - 1; d >= 0; --d) {
      if (d == skip) continue;
      const I q = i / dims[d];
      off += (i - q * dims[d]) * strides[d];
      i = q;
    }
    return off;
  }
};

template <class I>
Walk<I> walk_of(const UnitPlan& u) {
  Walk<I> w{};
  w.rank = u.rank;
  for (int d = 0; d < u.rank; ++d) {
    w.dims[d] = static_cast<I>(u.dims[d]);
    w.strides[d] = static_cast<I>(u.strides[d]);
  }
  return w;
}

// dst[i] = src[offset of i] for every output unit i: writes coalesced, reads coalesced
// where the innermost output dimension has source stride 1. Bound: 2 * n * es bytes moved;
// on an H200 3.85 TB/s for f32 (B, T, H, D) -> (B, H, T, D) and (B, T, 3, H, D) ->
// (3, B, H, T, D) (rows of D moved in 16-byte units).
template <class T, class I>
__global__ void permute_gather_kernel(const T* __restrict__ src, T* __restrict__ dst, Walk<I> w,
                                      I n) {
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = src[w.source(i, w.rank, -1)];
}

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // a block of 32 x 8 threads moves a 32 x 32 tile

// The batch's offsets in the source and the output: its index over the dimensions other
// than k and last, walked in the source by their strides and in the output by its row-major
// layout.
template <class I>
__device__ inline void batch_bases(const Walk<I>& w, int k, I batch, I& src_base, I& dst_base) {
  const int last = w.rank - 1;
  src_base = w.source(batch, last, k);
  dst_base = 0;
  I rem = batch, stride = w.dims[last];
  for (int d = last - 1; d >= 0; --d) {
    if (d != k) {
      const I q = rem / w.dims[d];
      dst_base += (rem - q * w.dims[d]) * stride;
      rem = q;
    }
    stride *= w.dims[d];
  }
}

// The transpose of dimensions k (source stride 1) and last (output stride 1) of every
// batch (the other dimensions), both of 32 units or more: each block of 32 x 8 threads
// loads 32 x 32 tiles with reads coalesced along k, and stores them through shared memory
// with writes coalesced along last. Tiles are walked by a grid-stride loop (batch, k tile,
// last tile) so any size fits a bounded 1-D grid. Bound: 2 * n * es bytes moved; on an
// H200 2.6-2.95 TB/s with f32 units, 1.67 TB/s with bf16 ones (2-byte loads: the next
// thing to widen).
template <class T, class I>
__global__ void permute_transpose_kernel(const T* __restrict__ src, T* __restrict__ dst, Walk<I> w,
                                         int k, I dst_stride_k, I batches) {
  __shared__ T tile[kTile][kTile + 1];
  const int last = w.rank - 1;
  const I len_k = w.dims[k], len_l = w.dims[last], stride_l = w.strides[last];
  const I tiles_k = (len_k + kTile - 1) / kTile, tiles_l = (len_l + kTile - 1) / kTile;
  const I tiles = batches * tiles_k * tiles_l;
  for (I t = blockIdx.x; t < tiles; t += gridDim.x) {
    const I tl = t % tiles_l, rest = t / tiles_l;
    const I tk = rest % tiles_k, batch = rest / tiles_k;
    I src_base, dst_base;
    batch_bases(w, k, batch, src_base, dst_base);
    const I k0 = tk * kTile, l0 = tl * kTile;
    __syncthreads();  // the previous tile's reads of `tile` are done
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const I ck = k0 + threadIdx.x, cl = l0 + r;
      if (ck < len_k && cl < len_l) tile[r][threadIdx.x] = src[src_base + ck + cl * stride_l];
    }
    __syncthreads();
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const I ck = k0 + r, cl = l0 + threadIdx.x;
      if (ck < len_k && cl < len_l) dst[dst_base + ck * dst_stride_k + cl] = tile[threadIdx.x][r];
    }
  }
}

// The transpose with one short side (under 32 units): tiles of kTileUnits units, 2^a x 2^b
// (a + b = 10) with the short side's length rounded up to a power of two, so that the short
// side does not leave most of a 32 x 32 tile empty.
constexpr int kTileLog = 10;
constexpr int kTileUnits = 1 << kTileLog;
constexpr int kTileThreads = 256;

// As permute_transpose_kernel, with tiles of 2^log_k x 2^log_l units (log_k + log_l = 10)
// moved by 256 threads: consecutive threads along k for the loads, along last for the
// stores. Bound: 2 * n * es bytes moved; on an H200 2.2 TB/s for f32 (N, 3) <-> (3, N), 1.5
// TB/s for bf16 (N, 8) -> (8, N).
template <class T, class I>
__global__ void permute_transpose_short_kernel(const T* __restrict__ src, T* __restrict__ dst,
                                               Walk<I> w, int k, I dst_stride_k, I batches,
                                               int log_k) {
  // The tile, one row of 2^log_l (+ 1, against bank conflicts) units per k.
  __shared__ T tile[kTileUnits + kTileUnits / 2];
  const int log_l = kTileLog - log_k, tk_len = 1 << log_k, tl_len = 1 << log_l;
  const int row = tl_len + 1;
  const int last = w.rank - 1;
  const I len_k = w.dims[k], len_l = w.dims[last], stride_l = w.strides[last];
  const I tiles_k = (len_k + tk_len - 1) >> log_k, tiles_l = (len_l + tl_len - 1) >> log_l;
  const I tiles = batches * tiles_k * tiles_l;
  for (I t = blockIdx.x; t < tiles; t += gridDim.x) {
    const I tl = t % tiles_l, rest = t / tiles_l;
    const I tk = rest % tiles_k, batch = rest / tiles_k;
    I src_base, dst_base;
    batch_bases(w, k, batch, src_base, dst_base);
    const I k0 = static_cast<I>(tk) << log_k, l0 = static_cast<I>(tl) << log_l;
    __syncthreads();  // the previous tile's reads of `tile` are done
    for (int e = threadIdx.x; e < kTileUnits; e += kTileThreads) {
      const int kk = e & (tk_len - 1), ll = e >> log_k;
      const I ck = k0 + kk, cl = l0 + ll;
      if (ck < len_k && cl < len_l) tile[kk * row + ll] = src[src_base + ck + cl * stride_l];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kTileUnits; e += kTileThreads) {
      const int ll = e & (tl_len - 1), kk = e >> log_l;
      const I ck = k0 + kk, cl = l0 + ll;
      if (ck < len_k && cl < len_l) dst[dst_base + ck * dst_stride_k + cl] = tile[kk * row + ll];
    }
  }
}

// log2 of the smallest power of two >= len (len <= 2^kTileLog).
int log2_ceil(std::int64_t len) {
  int l = 0;
  while ((std::int64_t(1) << l) < len)
    ++l;
  return l;
}

// A tiled transpose where the source's contiguous dimension k moves and one of the two
// sides has 32 units or more; the gather otherwise (both sides short: a warp's reads then
// fall in a few lines anyway).
template <class T, class I>
void launch_permute(const void* src, void* dst, const UnitPlan& u, std::int64_t units,
                    cudaStream_t stream) {
  const Walk<I> w = walk_of<I>(u);
  const int last = u.rank - 1;
  int k = -1;
  if (u.rank >= 2 && u.strides[last] != 1)
    for (int d = 0; d < last; ++d)
      if (u.strides[d] == 1) k = d;
  if (k >= 0 && u.dims[k] < kTile && u.dims[last] < kTile) k = -1;
  if (k < 0) {
    permute_gather_kernel<T, I><<<grid_for(units), kThreads, 0, stream>>>(
        static_cast<const T*>(src), static_cast<T*>(dst), w, static_cast<I>(units));
    DISTJAX_CUDA_LAUNCHED("permute");
    return;
  }
  std::int64_t dst_stride_k = 1, batches = 1;
  for (int d = k + 1; d < u.rank; ++d)
    dst_stride_k *= u.dims[d];
  for (int d = 0; d < last; ++d)
    if (d != k) batches *= u.dims[d];
  if (u.dims[k] >= kTile && u.dims[last] >= kTile) {
    const std::int64_t tiles =
        batches * ((u.dims[k] + kTile - 1) / kTile) * ((u.dims[last] + kTile - 1) / kTile);
    permute_transpose_kernel<T, I><<<grid_for(tiles, 1), dim3(kTile, kTileRows), 0, stream>>>(
        static_cast<const T*>(src), static_cast<T*>(dst), w, k, static_cast<I>(dst_stride_k),
        static_cast<I>(batches));
  } else {
    const int log_k = u.dims[k] < kTile ? log2_ceil(u.dims[k]) : kTileLog - log2_ceil(u.dims[last]);
    const std::int64_t tk_len = std::int64_t(1) << log_k, tl_len = kTileUnits / tk_len;
    const std::int64_t tiles =
        batches * ((u.dims[k] + tk_len - 1) / tk_len) * ((u.dims[last] + tl_len - 1) / tl_len);
    permute_transpose_short_kernel<T, I><<<grid_for(tiles, 1), kTileThreads, 0, stream>>>(
        static_cast<const T*>(src), static_cast<T*>(dst), w, k, static_cast<I>(dst_stride_k),
        static_cast<I>(batches), log_k);
  }
  DISTJAX_CUDA_LAUNCHED("permute");
}

// 32-bit indices where every output unit and every source offset fits.
template <class T>
void launch_permute_unit(const void* src, void* dst, const UnitPlan& u, std::int64_t units,
                         cudaStream_t stream) {
  std::int64_t max_offset = 0;
  for (int d = 0; d < u.rank; ++d)
    max_offset += (u.dims[d] - 1) * (u.strides[d] < 0 ? -u.strides[d] : u.strides[d]);
  if (units <= INT32_MAX && max_offset <= INT32_MAX)
    launch_permute<T, std::uint32_t>(src, dst, u, units, stream);
  else
    launch_permute<T, std::uint64_t>(src, dst, u, units, stream);
}

void permute(const void* src, void* dst, std::size_t es, const PermutePlan& p, std::int64_t n) {
  if (n <= 0 || es == 0) return;
  DISTJAX_CHECK(p.rank >= 0 && p.rank <= kMaxKernelRank, InvalidArgument, "[permute] rank ", p.rank,
                " outside [0, ", kMaxKernelRank, "]");
  const UnitPlan u = unit_plan(src, dst, es, p);
  const std::int64_t units = static_cast<std::int64_t>(static_cast<std::size_t>(n) * es / u.unit);
  const cudaStream_t stream = thread_stream();
  switch (u.unit) {
    case 16:
      return launch_permute_unit<U16>(src, dst, u, units, stream);
    case 8:
      return launch_permute_unit<std::uint64_t>(src, dst, u, units, stream);
    case 4:
      return launch_permute_unit<std::uint32_t>(src, dst, u, units, stream);
    case 2:
      return launch_permute_unit<std::uint16_t>(src, dst, u, units, stream);
    default:
      return launch_permute_unit<std::uint8_t>(src, dst, u, units, stream);
  }
}

// ---------------------------------------------------------------- broadcast

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// out[i] = x[0] (Scalar), x[i % inner] (Row) or x[i / inner] (Col): float4 stores, and for
// a row float4 loads, when inner is a multiple of 4 and the pointers are 16-byte aligned.
// Bound: 4 bytes written per element (x is read through the cache); a row broadcast writes
// 4.3 TB/s on an H200.
template <K kKind>
__global__ void broadcast_kernel(const float* __restrict__ x, std::int64_t inner,
                                 float* __restrict__ out, std::int64_t n, bool vec) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t head = 0;
  if (vec) {
    const std::int64_t n4 = n / 4;
    auto* o4 = reinterpret_cast<float4*>(out);
    for (std::int64_t j = t; j < n4; j += stride) {
      float4 v;
      if (kKind == K::Row) {
        v = reinterpret_cast<const float4*>(x)[(4 * j % inner) / 4];
      } else {
        const float s = kKind == K::Scalar ? x[0] : x[4 * j / inner];
        v = make_float4(s, s, s, s);
      }
      o4[j] = v;
    }
    head = n4 * 4;
  }
  for (std::int64_t i = head + t; i < n; i += stride)
    out[i] = kKind == K::Scalar ? x[0] : kKind == K::Row ? x[i % inner] : x[i / inner];
}

// The General kind: out[i] = x[index of i] over the plan's dimensions, merged (size-1
// dimensions dropped, neighbours the operand walks as one joined). Bound: 4 bytes written
// per element.
template <class I>
__global__ void broadcast_general_kernel(const float* __restrict__ x, Walk<I> w,
                                         float* __restrict__ out, I n) {
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = x[w.source(i, w.rank, -1)];
}

template <K kKind>
void launch_broadcast(const float* x, std::int64_t inner, float* out, std::int64_t n,
                      cudaStream_t stream) {
  const bool vec =
      aligned16(out) && (kKind != K::Row || aligned16(x)) && (kKind == K::Scalar || inner % 4 == 0);
  broadcast_kernel<kKind>
      <<<grid_for(vec ? n / 4 + 1 : n), kThreads, 0, stream>>>(x, inner, out, n, vec);
  DISTJAX_CUDA_LAUNCHED("broadcast");
}

template <class I>
void launch_broadcast_general(const float* x, const BroadcastPlan& q, float* out, std::int64_t n,
                              cudaStream_t stream) {
  UnitPlan u;
  for (int d = 0; d < q.rank; ++d)
    push_dim(u, q.dims[d], q.strides[d]);
  broadcast_general_kernel<I>
      <<<grid_for(n), kThreads, 0, stream>>>(x, walk_of<I>(u), out, static_cast<I>(n));
  DISTJAX_CUDA_LAUNCHED("broadcast");
}

void broadcast(const float* x, const BroadcastPlan& q, float* out, std::int64_t n) {
  if (n <= 0) return;
  const cudaStream_t stream = thread_stream();
  switch (q.kind) {
    case K::Same:
      DISTJAX_CUDA_CHECK(cudaMemcpyAsync(out, x, static_cast<std::size_t>(n) * sizeof(float),
                                         cudaMemcpyDeviceToDevice, stream),
                         "broadcast", n, " elements");
      return;
    case K::Scalar:
      return launch_broadcast<K::Scalar>(x, 1, out, n, stream);
    case K::Row:
      return launch_broadcast<K::Row>(x, q.inner, out, n, stream);
    case K::Col:
      return launch_broadcast<K::Col>(x, q.inner, out, n, stream);
    default:
      if (n <= INT32_MAX) return launch_broadcast_general<std::uint32_t>(x, q, out, n, stream);
      return launch_broadcast_general<std::uint64_t>(x, q, out, n, stream);
  }
}

}  // namespace

const detail::ShapeKernels shape_kernels{
    .permute = permute,
    .broadcast = broadcast,
};

}  // namespace distjax::tensor::cuda
