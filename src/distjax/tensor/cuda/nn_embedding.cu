// CUDA kernels of the nn family driven by ids (see table/nn.hpp and cpu/nn.cpp): the check
// for ids outside [0, v), the embedding gather, and its backward, a scatter-add made
// deterministic by sorting: (id, position) pairs are radix-sorted by id (CUB; the sort is
// stable, so each id's positions stay in increasing order), then each run of equal ids adds
// its rows into gtable in that order, as the CPU does (bit for bit). Bounds are bytes moved.
// The backward of 8192 ids of 768 columns takes 77 us on an H200, mostly the sort (full
// key width: the table's row count is not an argument).
#include <cub/cub.cuh>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "distjax/tensor/cuda/nn.cuh"

namespace distjax::tensor::cuda::nn {
namespace {

template <class P>
using IdOf = std::remove_cv_t<std::remove_pointer_t<P>>;

// ------------------------------------------------------------------ find_bad_id

// bad[0] holds the smallest bad index found so far (kNoBad: none); bad[1] is written last.
constexpr long long kNoBad = LLONG_MAX;

__global__ void bad_id_init_kernel(long long* bad) {
  bad[0] = kNoBad;
  bad[1] = 0;
}

// Every bad id's index into bad[0] by an integer atomicMin, so the first one wins whatever
// the order. Bound: one read of the ids.
template <class Id>
__global__ void bad_id_scan_kernel(const Id* __restrict__ ids, std::int64_t n, std::int64_t v,
                                   long long* bad) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t id = ids[i];
    if (!(id >= 0 && id < v)) atomicMin(bad, static_cast<long long>(i));
  }
}

// bad = {first bad index, its id}, or {-1, 0} when every id lies inside.
template <class Id>
__global__ void bad_id_final_kernel(const Id* __restrict__ ids, long long* bad) {
  if (bad[0] == kNoBad) {
    bad[0] = -1;
    bad[1] = 0;
  } else {
    bad[1] = static_cast<long long>(ids[bad[0]]);
  }
}

// ------------------------------------------------------------------ embedding

// out row r = table row ids[r] (NaN for an id outside [0, rows)). Bound: 8 bytes per
// output element.
template <int V, class Id>
__global__ void embedding_kernel(const float* __restrict__ table, const Id* __restrict__ ids,
                                 float* __restrict__ out, std::int64_t n, std::int64_t c,
                                 std::int64_t rows) {
  const std::int64_t cv = c / V;
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const auto id = static_cast<std::int64_t>(ids[r]);
    float* dst = out + r * c;
    if (id < 0 || id >= rows) {
      Pack<V> nan;
#pragma unroll
      for (int e = 0; e < V; ++e)
        nan.v[e] = __int_as_float(0x7fc00000);
      for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x)
        store_pack<V>(dst, j, nan);
      continue;
    }
    const float* src = table + id * c;
    for (std::int64_t j = threadIdx.x; j < cv; j += blockDim.x)
      store_pack<V>(dst, j, load_pack<V>(src, j));
  }
}

__global__ void iota_kernel(std::int64_t* p, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = i;
}

// With ids sorted (sid) and their positions (spos, increasing within a run of equal ids):
// block x = k, where a run starts, adds g's rows spos[k], spos[k + 1], ... of the run one
// after the other to gtable row sid[k] (blocks y share the run's columns). Other blocks
// return at once. Bound: 4 bytes per element of g plus 8 per touched element of gtable.
template <int V, class Id>
__global__ void embedding_backward_kernel(const float* __restrict__ g, const Id* __restrict__ sid,
                                          const std::int64_t* __restrict__ spos,
                                          float* __restrict__ gtable, std::int64_t n,
                                          std::int64_t c, std::int64_t rows) {
  const std::int64_t cv = c / V;
  for (std::int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const Id id = sid[k];
    if (k > 0 && sid[k - 1] == id) continue;
    if (id < 0 || static_cast<std::int64_t>(id) >= rows) continue;  // no row: nothing to add
    float* dst = gtable + static_cast<std::int64_t>(id) * c;
    for (std::int64_t j = std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x; j < cv;
         j += std::int64_t(gridDim.y) * blockDim.x) {
      Pack<V> acc = load_pack<V>(dst, j);
      for (std::int64_t p = k; p < n && sid[p] == id; ++p) {
        const Pack<V> gp = load_pack<V>(g + spos[p] * c, j);
#pragma unroll
        for (int e = 0; e < V; ++e)
          acc.v[e] += gp.v[e];
      }
      store_pack<V>(dst, j, acc);
    }
  }
}

// Offsets of the scratch's parts, each 256-byte aligned.
std::size_t align256(std::size_t b) {
  return (b + 255) / 256 * 256;
}

template <class Id>
void embedding_backward_ids(const float* g, const Id* ids, float* gtable, std::int64_t n,
                            std::int64_t c, std::int64_t v, cudaStream_t st) {
  constexpr const char* kOp = "embedding_backward";
  std::size_t sort_bytes = 0;
  DISTJAX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
                         nullptr, sort_bytes, ids, (Id*)nullptr, (const std::int64_t*)nullptr,
                         (std::int64_t*)nullptr, n, 0, int(sizeof(Id) * 8), st),
                     kOp, "sort of ", n, " ids (scratch size)");
  const std::size_t pos_bytes = align256(std::size_t(n) * sizeof(std::int64_t));
  const std::size_t id_bytes = align256(std::size_t(n) * sizeof(Id));
  void* scratch = nullptr;
  DISTJAX_CUDA_CHECK(cudaMallocAsync(&scratch, 2 * pos_bytes + id_bytes + sort_bytes, st), kOp,
                     "sort scratch for ", n, " ids");
  char* base = static_cast<char*>(scratch);
  auto* pos = reinterpret_cast<std::int64_t*>(base);
  auto* spos = reinterpret_cast<std::int64_t*>(base + pos_bytes);
  auto* sid = reinterpret_cast<Id*>(base + 2 * pos_bytes);
  void* sort_tmp = base + 2 * pos_bytes + id_bytes;
  iota_kernel<<<grid_for(n), kThreads, 0, st>>>(pos, n);
  DISTJAX_CUDA_LAUNCHED(kOp);
  DISTJAX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, ids, sid, pos, spos, n,
                                                     0, int(sizeof(Id) * 8), st),
                     kOp, "sort of ", n, " ids");
  const int threads = row_threads(c, 128);
  const bool v4 = packs_of_4(c, {g, gtable});
  const std::int64_t cv = v4 ? c / 4 : c;
  const dim3 grid(row_blocks(n), static_cast<unsigned>(
                                     std::min<std::int64_t>((cv + threads - 1) / threads, 65535)));
  if (v4)
    embedding_backward_kernel<4, Id><<<grid, threads, 0, st>>>(g, sid, spos, gtable, n, c, v);
  else
    embedding_backward_kernel<1, Id><<<grid, threads, 0, st>>>(g, sid, spos, gtable, n, c, v);
  DISTJAX_CUDA_LAUNCHED(kOp);
  DISTJAX_CUDA_CHECK(cudaFreeAsync(scratch, st), kOp);
}

}  // namespace

void find_bad_id(const void* ids, DType id_dtype, std::int64_t n, std::int64_t v,
                 std::int64_t* bad) {
  const cudaStream_t st = thread_stream();
  auto* b = reinterpret_cast<long long*>(bad);
  static_assert(sizeof(long long) == sizeof(std::int64_t));
  bad_id_init_kernel<<<1, 1, 0, st>>>(b);
  DISTJAX_CUDA_LAUNCHED("find_bad_id");
  with_ids(ids, id_dtype, [&](const auto* pi) {
    if (n > 0) {
      bad_id_scan_kernel<<<grid_for(n), kThreads, 0, st>>>(pi, n, v, b);
      DISTJAX_CUDA_LAUNCHED("find_bad_id");
    }
    bad_id_final_kernel<<<1, 1, 0, st>>>(pi, b);
    DISTJAX_CUDA_LAUNCHED("find_bad_id");
  });
}

void embedding(const float* table, const void* ids, DType id_dtype, float* out, std::int64_t n,
               std::int64_t c, std::int64_t v) {
  if (n == 0 || c == 0) return;
  const cudaStream_t st = thread_stream();
  const int threads = row_threads(c, 256);
  const bool v4 = packs_of_4(c, {table, out});
  with_ids(ids, id_dtype, [&](const auto* pi) {
    using Id = IdOf<decltype(pi)>;
    if (v4)
      embedding_kernel<4, Id><<<row_blocks(n), threads, 0, st>>>(table, pi, out, n, c, v);
    else
      embedding_kernel<1, Id><<<row_blocks(n), threads, 0, st>>>(table, pi, out, n, c, v);
  });
  DISTJAX_CUDA_LAUNCHED("embedding");
}

void embedding_backward(const float* g, const void* ids, DType id_dtype, float* gtable,
                        std::int64_t n, std::int64_t c, std::int64_t v) {
  if (n == 0 || c == 0) return;
  const cudaStream_t st = thread_stream();
  with_ids(ids, id_dtype,
           [&](const auto* pi) { embedding_backward_ids(g, pi, gtable, n, c, v, st); });
}

}  // namespace distjax::tensor::cuda::nn
