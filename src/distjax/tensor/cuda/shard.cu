// CUDA kernels of the parallel layers: shard boxes, vocabulary-parallel ids and one-hot
// labels, pmax's owner masks, the gradient norm's sum of squares (table/parallel.hpp;
// cpu/parallel.cpp defines the results, bit for bit). Measured on an H200: select_equal
// 4.2 TB/s; copy_box of a (768, 3072) box 3.4 TB/s, of a one-column box 1.1 TB/s;
// sum_squares_f64 in chunks since (its single-block predecessor: 39 ms for 38.6M elements).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/launch.cuh"
#include "distjax/tensor/cuda/stream_scratch.cuh"

namespace distjax::tensor::cuda {
namespace {

using detail::BoxPlan;
using detail::IdReport;
using detail::kMaxKernelRank;

constexpr unsigned kFullMask = 0xffffffffu;

// ---- copy_box -------------------------------------------------------------------------

// A box copied in units of T (1 to 16 bytes, so that every row start on both sides is
// aligned to one): rows of `row_units` units, the box's outer dimensions `shape[d]`,
// d < outer_rank, whose rows start `base + sum idx[d] * strides[d]` units into global. By
// value (kernel parameter): BoxPlan's arrays are host memory.
struct BoxArgs {
  int outer_rank = 0;
  std::int64_t shape[kMaxKernelRank] = {};
  std::int64_t strides[kMaxKernelRank] = {};
  std::int64_t base = 0;
  std::int64_t rows = 0;
  std::int64_t row_units = 0;
};

// Units of global where box row `row` starts.
__device__ std::int64_t box_row_start(const BoxArgs& a, std::int64_t row) {
  std::int64_t off = a.base;
  for (int d = a.outer_rank - 1; d >= 0; --d) {
    off += (row % a.shape[d]) * a.strides[d];
    row /= a.shape[d];
  }
  return off;
}

// Long rows: one block per (row, chunk of `chunk` units), the row's start computed once
// per block. Bound: 2 x the box's bytes moved.
template <class T>
__global__ void copy_box_rows(T* __restrict__ global, T* __restrict__ local, BoxArgs a,
                              std::int64_t chunks, std::int64_t chunk, bool to_local) {
  for (std::int64_t b = blockIdx.x; b < a.rows * chunks; b += gridDim.x) {
    const std::int64_t row = b / chunks, u0 = (b % chunks) * chunk;
    const std::int64_t u1 = min(a.row_units, u0 + chunk);
    T* g = global + box_row_start(a, row);
    T* l = local + row * a.row_units;
    if (to_local) {
      for (std::int64_t u = u0 + threadIdx.x; u < u1; u += blockDim.x)
        l[u] = g[u];
    } else {
      for (std::int64_t u = u0 + threadIdx.x; u < u1; u += blockDim.x)
        g[u] = l[u];
    }
  }
}

// Short rows: one thread per unit (grid-stride), each finding its row's start. Bound: 2 x
// the box's bytes moved (index arithmetic may dominate for rows of a few units).
template <class T>
__global__ void copy_box_units(T* __restrict__ global, T* __restrict__ local, BoxArgs a,
                               bool to_local) {
  const std::int64_t n = a.rows * a.row_units;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const std::int64_t row = e / a.row_units;
    const std::int64_t at = box_row_start(a, row) + (e - row * a.row_units);
    if (to_local)
      local[e] = global[at];
    else
      global[at] = local[e];
  }
}

// Rows of fewer units than this take copy_box_units.
constexpr std::int64_t kShortRowUnits = 128;
// Units one block copies of a long row (16 KiB of 16-byte units).
constexpr std::int64_t kRowChunkUnits = 4 * kThreads;

template <class T>
void copy_box_as(void* global, void* local, BoxArgs a, bool to_local, cudaStream_t stream) {
  T* g = static_cast<T*>(global);
  T* l = static_cast<T*>(local);
  if (a.row_units < kShortRowUnits) {
    copy_box_units<T><<<grid_for(a.rows * a.row_units), kThreads, 0, stream>>>(g, l, a, to_local);
  } else {
    const std::int64_t chunks = (a.row_units + kRowChunkUnits - 1) / kRowChunkUnits;
    copy_box_rows<T><<<grid_for(a.rows * chunks, 1), kThreads, 0, stream>>>(
        g, l, a, chunks, kRowChunkUnits, to_local);
  }
  DISTJAX_CUDA_LAUNCHED("copy_box");
}

// As the CPU: rows of the box's last dimension, contiguous on both sides. The unit is the
// largest of 16, 8, 4, 2 or 1 bytes that divides both pointers, the row's length and every
// row start's offset in global.
void copy_box(void* global, void* local, const BoxPlan& plan, bool to_local) {
  const std::int64_t es = static_cast<std::int64_t>(plan.elem_bytes);
  const int rank = plan.rank;
  DISTJAX_CHECK(rank <= kMaxKernelRank, InvalidArgument, "[copy_box] a box of rank ", rank,
                " (the CUDA kernel takes up to ", kMaxKernelRank, ")");
  std::int64_t count = 1;
  for (int d = 0; d < rank; ++d)
    count *= plan.shape[d];
  if (count == 0 || es == 0) return;
  BoxArgs a;
  std::int64_t base = 0;  // elements
  for (int d = 0; d < rank; ++d)
    base += plan.offset[d] * plan.strides[d];
  const std::int64_t row = rank == 0 ? 1 : plan.shape[rank - 1];
  a.rows = count / row;
  std::uintptr_t bits = reinterpret_cast<std::uintptr_t>(static_cast<char*>(global) + base * es) |
                        reinterpret_cast<std::uintptr_t>(local) |
                        static_cast<std::uintptr_t>(row * es);
  a.outer_rank = std::max(rank - 1, 0);
  for (int d = 0; d < a.outer_rank; ++d) {
    a.shape[d] = plan.shape[d];
    a.strides[d] = plan.strides[d];
    if (plan.shape[d] > 1) bits |= static_cast<std::uintptr_t>(plan.strides[d] * es);
  }
  std::int64_t unit = 16;
  while (unit > 1 && (bits & static_cast<std::uintptr_t>(unit - 1)) != 0)
    unit /= 2;
  // Offsets in units: base * es and each row stride * es are multiples of the unit.
  a.base = base * es / unit;
  for (int d = 0; d < a.outer_rank; ++d)
    a.strides[d] = a.strides[d] * es / unit;
  a.row_units = row * es / unit;
  const cudaStream_t stream = thread_stream();
  switch (unit) {
    case 16:
      copy_box_as<uint4>(global, local, a, to_local, stream);
      break;
    case 8:
      copy_box_as<uint2>(global, local, a, to_local, stream);
      break;
    case 4:
      copy_box_as<std::uint32_t>(global, local, a, to_local, stream);
      break;
    case 2:
      copy_box_as<std::uint16_t>(global, local, a, to_local, stream);
      break;
    default:
      copy_box_as<std::uint8_t>(global, local, a, to_local, stream);
      break;
  }
}

// ---- ids and one-hot labels -------------------------------------------------------------

// What the id kernels count: counters[0] the bad ids, counters[1] the least element index
// of a bad one (all ones while none), then the IdReport that id_report fills.
struct IdScratch {
  unsigned long long bad;
  unsigned long long first;
  IdReport report;
};

// Counts the bad flags of one warp's 32 consecutive elements (lane k: element i0 + k):
// one atomic per warp. Every lane of the warp must call it.
__device__ void count_bad(bool bad, std::int64_t i0, IdScratch* counts) {
  const unsigned ballot = __ballot_sync(kFullMask, bad);
  if (ballot != 0 && (threadIdx.x & 31) == 0) {
    atomicAdd(&counts->bad, static_cast<unsigned long long>(__popc(ballot)));
    atomicMin(&counts->first, static_cast<unsigned long long>(i0 + __ffs(ballot) - 1));
  }
}

// The report from the counts: how many, and the value of the first bad id.
template <class T>
__global__ void id_report(const T* __restrict__ ids, IdScratch* counts) {
  counts->report.bad = static_cast<std::int64_t>(counts->bad);
  counts->report.first = counts->bad ? static_cast<std::int64_t>(ids[counts->first]) : 0;
}

// local[i] = id - lo and keep[i] = 1 for ids in [lo, lo + rows), else 0 and 0; with
// `counts`, ids outside [0, bound) are counted. Whole warps walk the elements (grid-stride
// in warp-aligned steps) so that every lane reaches the ballot. Bound: 12 or 16 bytes moved
// per id.
template <class T>
__global__ void shard_ids_kernel(const T* __restrict__ ids, std::int64_t n, std::int64_t lo,
                                 std::int64_t rows, std::int64_t bound,
                                 std::int64_t* __restrict__ local, float* __restrict__ keep,
                                 IdScratch* counts) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       i - (threadIdx.x & 31) < n; i += stride) {
    bool bad = false;
    if (i < n) {
      const std::int64_t id = ids[i];
      bad = id < 0 || id >= bound;
      const bool mine = id >= lo && id < lo + rows;
      local[i] = mine ? id - lo : 0;
      keep[i] = mine ? 1.f : 0.f;
    }
    if (counts) count_bad(bad, i - (threadIdx.x & 31), counts);
  }
}

// out[i * width + label - lo] = 1 for labels in [lo, lo + width); labels outside
// [0, bound) are counted. Bound: 4 or 8 bytes read per label, a scattered store for each
// of this shard's.
template <class T>
__global__ void shard_one_hot_kernel(const T* __restrict__ labels, std::int64_t n, std::int64_t lo,
                                     std::int64_t width, std::int64_t bound,
                                     float* __restrict__ out, IdScratch* counts) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       i - (threadIdx.x & 31) < n; i += stride) {
    bool bad = false;
    if (i < n) {
      const std::int64_t y = labels[i];
      bad = y < 0 || y >= bound;
      if (y >= lo && y < lo + width) out[i * width + (y - lo)] = 1.f;
    }
    count_bad(bad, i - (threadIdx.x & 31), counts);
  }
}

// Zeroes the counts, runs `launch(counts)` and `report(counts)`, and copies the report to
// host memory, synchronising the stream.
template <class Launch, class Report>
void counted(const char* op, IdReport* host_report, cudaStream_t stream, Launch&& launch,
             Report&& report) {
  StreamScratch scratch(sizeof(IdScratch), stream, op);
  IdScratch* counts = scratch.as<IdScratch>();
  DISTJAX_CUDA_CHECK(cudaMemsetAsync(&counts->bad, 0, sizeof(counts->bad), stream), op);
  DISTJAX_CUDA_CHECK(cudaMemsetAsync(&counts->first, 0xff, sizeof(counts->first), stream), op);
  launch(counts);
  DISTJAX_CUDA_LAUNCHED(op);
  report(counts);
  DISTJAX_CUDA_LAUNCHED(op);
  DISTJAX_CUDA_CHECK(cudaMemcpyAsync(host_report, &counts->report, sizeof(IdReport),
                                     cudaMemcpyDeviceToHost, stream),
                     op);
  scratch.release();
  DISTJAX_CUDA_CHECK(cudaStreamSynchronize(stream), op);
}

template <class T>
void shard_ids_of(const T* ids, std::int64_t n, std::int64_t lo, std::int64_t rows,
                  std::int64_t bound, std::int64_t* local, float* keep, IdReport* host_report,
                  cudaStream_t stream) {
  auto launch = [&](IdScratch* counts) {
    shard_ids_kernel<T>
        <<<grid_for(n), kThreads, 0, stream>>>(ids, n, lo, rows, bound, local, keep, counts);
  };
  if (bound < 0) {  // nothing counted: no report to wait for
    launch(nullptr);
    DISTJAX_CUDA_LAUNCHED("shard_ids");
    return;
  }
  counted("shard_ids", host_report, stream, launch,
          [&](IdScratch* counts) { id_report<T><<<1, 1, 0, stream>>>(ids, counts); });
}

void shard_ids(const void* ids, DType dtype, std::int64_t n, std::int64_t lo, std::int64_t rows,
               std::int64_t bound, std::int64_t* local, float* keep, IdReport* host_report) {
  *host_report = {};
  if (n == 0) return;
  if (dtype == DType::I32)
    shard_ids_of(static_cast<const std::int32_t*>(ids), n, lo, rows, bound, local, keep,
                 host_report, thread_stream());
  else
    shard_ids_of(static_cast<const std::int64_t*>(ids), n, lo, rows, bound, local, keep,
                 host_report, thread_stream());
}

template <class T>
void shard_one_hot_of(const T* labels, std::int64_t n, std::int64_t lo, std::int64_t width,
                      std::int64_t bound, float* out, IdReport* host_report, cudaStream_t stream) {
  counted(
      "shard_one_hot", host_report, stream,
      [&](IdScratch* counts) {
        shard_one_hot_kernel<T>
            <<<grid_for(n), kThreads, 0, stream>>>(labels, n, lo, width, bound, out, counts);
      },
      [&](IdScratch* counts) { id_report<T><<<1, 1, 0, stream>>>(labels, counts); });
}

void shard_one_hot(const void* labels, DType dtype, std::int64_t n, std::int64_t lo,
                   std::int64_t width, std::int64_t bound, float* out, IdReport* host_report) {
  *host_report = {};
  if (n == 0) return;
  if (dtype == DType::I32)
    shard_one_hot_of(static_cast<const std::int32_t*>(labels), n, lo, width, bound, out,
                     host_report, thread_stream());
  else
    shard_one_hot_of(static_cast<const std::int64_t*>(labels), n, lo, width, bound, out,
                     host_report, thread_stream());
}

// ---- select_equal -----------------------------------------------------------------------

__device__ float select_one(float a, float b, float value) {
  return a == b ? value : 0.f;
}

// out[i] = a[i] == b[i] ? value : 0 (b[0] for every i when b_scalar); float4 accesses when
// `vec`. Bound: 12 bytes moved per element (8 with a scalar b).
__global__ void select_equal_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                    bool b_scalar, float value, float* __restrict__ out,
                                    std::int64_t n, bool vec) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t nv = vec ? n / 4 : 0;
  const float bs = b_scalar ? b[0] : 0.f;
  for (std::int64_t k = t; k < nv; k += stride) {
    const float4 av = reinterpret_cast<const float4*>(a)[k];
    const float4 bv =
        b_scalar ? make_float4(bs, bs, bs, bs) : reinterpret_cast<const float4*>(b)[k];
    reinterpret_cast<float4*>(out)[k] =
        make_float4(select_one(av.x, bv.x, value), select_one(av.y, bv.y, value),
                    select_one(av.z, bv.z, value), select_one(av.w, bv.w, value));
  }
  for (std::int64_t i = 4 * nv + t; i < n; i += stride)
    out[i] = select_one(a[i], b_scalar ? bs : b[i], value);
}

bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
}

void select_equal(const float* a, const float* b, bool b_scalar, float value, float* out,
                  std::int64_t n) {
  if (n == 0) return;
  const bool vec = aligned16(a) && aligned16(out) && (b_scalar || aligned16(b));
  select_equal_kernel<<<grid_for(vec ? n / 4 : n), kThreads, 0, thread_stream()>>>(
      a, b, b_scalar, value, out, n, vec);
  DISTJAX_CUDA_LAUNCHED("select_equal");
}

// ---- sum_squares_f64 ----------------------------------------------------------------------

// The table's order (parallel.hpp), bit for bit: 8 threads per chunk of kSquaresChunk
// elements, thread k adding the squares of the chunk's elements j % 8 == k in order (in f64;
// a square of a float is exact in f64, so a fused multiply-add rounds as the CPU's add), the
// chunk's 8 lanes combined in the fixed tree into partials[chunk]; then one thread adds the
// partials in chunk order. The chains run side by side (one per lane and chunk), where one
// block of 8 chains ran at the add latency (39 ms for 38.6M elements on an H200).
constexpr int kSquaresChunksPerBlock = kThreads / 8;

// Many leaves per launch: a table of up to kSquaresLeaves leaves in the kernels' arguments;
// leaf i owns blocks [first_block[i], first_block[i + 1]) of the chunk kernel and partials
// [first_chunk[i], first_chunk[i + 1]).
constexpr int kSquaresLeaves = 64;
struct SquaresTable {
  const float* x[kSquaresLeaves];
  std::int64_t n[kSquaresLeaves];
  std::int64_t first_block[kSquaresLeaves + 1];
  std::int64_t first_chunk[kSquaresLeaves + 1];
};
static_assert(sizeof(SquaresTable) + 32 <= 4096, "a kernel's arguments must fit in 4 KB");

// The chunks of block `block` (of the leaf x, n): partials[chunk] for its chunks.
__device__ __forceinline__ void sum_squares_chunks(const float* __restrict__ x, std::int64_t n,
                                                   double* __restrict__ partials,
                                                   std::int64_t chunks, std::int64_t block) {
  __shared__ double lanes[kThreads];
  const int t = threadIdx.x, lane = t % 8;
  const std::int64_t chunk = block * kSquaresChunksPerBlock + t / 8;
  double a = 0.0;
  if (chunk < chunks) {
    const std::int64_t at = chunk * detail::kSquaresChunk;
    const std::int64_t m = min(detail::kSquaresChunk, n - at);
    const float* q = x + at;
    for (std::int64_t j = lane; j < m; j += 8) {
      const double v = q[j];
      a += v * v;
    }
  }
  lanes[t] = a;
  __syncthreads();
  if (lane == 0 && chunk < chunks) {
    const double* l = lanes + t;
    partials[chunk] = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  }
}

// Block b: its leaf's chunks.
__global__ void __launch_bounds__(kThreads)
    sum_squares_chunks_kernel(const __grid_constant__ SquaresTable t, int leaves,
                              double* __restrict__ partials) {
  const std::int64_t b = blockIdx.x;
  int i = 0;
  while (i + 1 < leaves && t.first_block[i + 1] <= b)
    ++i;
  sum_squares_chunks(t.x[i], t.n[i], partials + t.first_chunk[i],
                     t.first_chunk[i + 1] - t.first_chunk[i], b - t.first_block[i]);
}

// Thread i: leaf i's partials added in chunk order into out[i].
__global__ void sum_squares_fold_kernel(const __grid_constant__ SquaresTable t, int leaves,
                                        const double* __restrict__ partials,
                                        double* __restrict__ out) {
  const int i = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= leaves) return;
  double total = 0.0;
  for (std::int64_t c = t.first_chunk[i]; c < t.first_chunk[i + 1]; ++c)
    total += partials[c];
  out[i] = total;
}

// Every leaf's sum into one device array (two launches per kSquaresLeaves leaves), then one
// copy to the host and one wait.
void sum_squares_f64_many(const float* const* xs, const std::int64_t* ns, std::int64_t count,
                          double* host_out) {
  if (count == 0) return;
  const cudaStream_t stream = thread_stream();
  StreamScratch results(sizeof(double) * static_cast<std::size_t>(count), stream,
                        "sum_of_squares_f64");
  for (std::int64_t at = 0; at < count; at += kSquaresLeaves) {
    const int leaves = static_cast<int>(std::min<std::int64_t>(kSquaresLeaves, count - at));
    SquaresTable t{};
    for (int i = 0; i < leaves; ++i) {
      const std::int64_t n = ns[at + i];
      const std::int64_t chunks = (n + detail::kSquaresChunk - 1) / detail::kSquaresChunk;
      t.x[i] = xs[at + i];
      t.n[i] = n;
      t.first_chunk[i + 1] = t.first_chunk[i] + chunks;
      t.first_block[i + 1] =
          t.first_block[i] + (chunks + kSquaresChunksPerBlock - 1) / kSquaresChunksPerBlock;
    }
    const std::int64_t blocks = t.first_block[leaves], chunks = t.first_chunk[leaves];
    StreamScratch partials(
        sizeof(double) * static_cast<std::size_t>(std::max<std::int64_t>(chunks, 1)), stream,
        "sum_of_squares_f64");
    if (blocks > 0) {
      sum_squares_chunks_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          t, leaves, partials.as<double>());
      DISTJAX_CUDA_LAUNCHED("sum_of_squares_f64");
    }
    sum_squares_fold_kernel<<<1, kSquaresLeaves, 0, stream>>>(t, leaves, partials.as<double>(),
                                                              results.as<double>() + at);
    DISTJAX_CUDA_LAUNCHED("sum_of_squares_f64");
    partials.release();
  }
  DISTJAX_CUDA_CHECK(cudaMemcpyAsync(host_out, results.as<double>(),
                                     sizeof(double) * static_cast<std::size_t>(count),
                                     cudaMemcpyDeviceToHost, stream),
                     "sum_of_squares_f64");
  results.release();
  DISTJAX_CUDA_CHECK(cudaStreamSynchronize(stream), "sum_of_squares_f64");
}

void sum_squares_f64(const float* x, std::int64_t n, double* host_out) {
  sum_squares_f64_many(&x, &n, 1, host_out);
}

}  // namespace

const detail::ShardKernels shard_kernels{
    .copy_box = copy_box,
    .shard_ids = shard_ids,
    .shard_one_hot = shard_one_hot,
    .select_equal = select_equal,
    .sum_squares_f64 = sum_squares_f64,
    .sum_squares_f64_many = sum_squares_f64_many,
};

}  // namespace distjax::tensor::cuda
