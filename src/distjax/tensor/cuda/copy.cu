// CUDA kernels: fills, dtype conversion and copies (within a device, and to and from the
// host). Conversions round exactly as the CPU's cast_one: bf16 and f16 go through f32 and
// round to nearest even, integers truncate toward zero.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <type_traits>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda/kernels.hpp"
#include "distjax/tensor/cuda/halves.cuh"
#include "distjax/tensor/cuda/launch.cuh"

namespace distjax::tensor::cuda {
namespace {

using detail::Stream;

// One element from From to To, as detail::cast_one: halves through f32, else static_cast
// (the device's conversions round as the host's: nearest for floats, toward zero to ints).
template <class To, class From>
__device__ inline To cast_one(From v) {
  if constexpr (std::is_same_v<To, From> && !kHalf<From>)
    return v;
  else if constexpr (kHalf<From>)
    return cast_one<To>(f32_from_half(v));
  else if constexpr (kHalf<To>)
    return half_from_f32<To>(static_cast<float>(v));
  else
    return static_cast<To>(v);
}

template <class T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with the device element type of `t`.
template <class F>
void visit_device_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32:
      return f(Tag<float>{});
    case DType::BF16:
      return f(Tag<Bf16>{});
    case DType::F16:
      return f(Tag<F16>{});
    case DType::I32:
      return f(Tag<std::int32_t>{});
    case DType::I64:
      return f(Tag<std::int64_t>{});
    case DType::F64:
      return f(Tag<double>{});
  }
  DISTJAX_THROW(InvalidArgument, "[cuda convert] unknown dtype code ", static_cast<int>(t));
}

// kVec consecutive elements, loaded and stored as one access (16 bytes for 4-byte types).
constexpr int kVec = 4;
template <class T>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

bool aligned(const void* p, std::size_t a) {
  return reinterpret_cast<std::uintptr_t>(p) % a == 0;
}

// The widest unit (16, 8, 4, 2 or 1 bytes) that divides every value given (addresses,
// strides, lengths in bytes): a copy of whole such units is then always aligned.
std::size_t unit_of(std::initializer_list<std::uintptr_t> values) {
  std::uintptr_t bits = 16;
  for (std::uintptr_t v : values)
    bits |= v;
  return static_cast<std::size_t>(bits & (~bits + 1));
}

// 16-byte unit.
struct alignas(16) U16 {
  std::uint64_t lo, hi;
};

// ---------------------------------------------------------------- fill
// dst[i] = v, with 16-byte stores where dst is 16-byte aligned (W = 16 / sizeof(T) copies
// of v per store). Bound: sizeof(T) bytes written per element; 4.3 TB/s for 512 MiB of f32
// on an H200 (peak 4.8).
template <class T>
__global__ void fill_kernel(T* __restrict__ dst, std::int64_t n, T v, bool vec) {
  constexpr int W = 16 / sizeof(T);
  struct alignas(16) Line {
    T v[W];
  };
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t head = 0;
  if (vec) {
    Line line;
#pragma unroll
    for (int k = 0; k < W; ++k)
      line.v[k] = v;
    const std::int64_t lines = n / W;
    Line* d = reinterpret_cast<Line*>(dst);
    for (std::int64_t i = t; i < lines; i += stride)
      d[i] = line;
    head = lines * W;
  }
  for (std::int64_t i = head + t; i < n; i += stride)
    dst[i] = v;
}

template <class T>
void launch_fill(void* dst, std::int64_t n, T v, cudaStream_t stream) {
  const bool vec = aligned(dst, 16);
  fill_kernel<T><<<grid_for(vec ? n / (16 / sizeof(T)) + 1 : n), kThreads, 0, stream>>>(
      static_cast<T*>(dst), n, v, vec);
  DISTJAX_CUDA_LAUNCHED("fill");
}

// The bits of `value` in `dtype`, converted on the host as the CPU's cast_one<T>(double).
void fill(void* dst, DType dtype, std::int64_t n, double value) {
  if (n <= 0) return;
  const cudaStream_t stream = thread_stream();
  switch (dtype) {
    case DType::F32: {
      const float f = static_cast<float>(value);
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      return launch_fill<std::uint32_t>(dst, n, u, stream);
    }
    case DType::BF16:
      return launch_fill<std::uint16_t>(dst, n, bf16(static_cast<float>(value)).bits, stream);
    case DType::F16:
      return launch_fill<std::uint16_t>(
          dst, n, distjax::detail::f16_bits_from_f32(static_cast<float>(value)), stream);
    case DType::I32: {
      const auto i = static_cast<std::int32_t>(value);
      std::uint32_t u;
      std::memcpy(&u, &i, 4);
      return launch_fill<std::uint32_t>(dst, n, u, stream);
    }
    case DType::I64: {
      const auto i = static_cast<std::int64_t>(value);
      std::uint64_t u;
      std::memcpy(&u, &i, 8);
      return launch_fill<std::uint64_t>(dst, n, u, stream);
    }
    case DType::F64: {
      std::uint64_t u;
      std::memcpy(&u, &value, 8);
      return launch_fill<std::uint64_t>(dst, n, u, stream);
    }
  }
  DISTJAX_THROW(InvalidArgument, "[fill] unknown dtype code ", static_cast<int>(dtype));
}

// ---------------------------------------------------------------- convert
// d[i] = cast_one<To>(s[i]); with kVec elements per access where both pointers allow.
// Bound: sizeof(From) + sizeof(To) bytes moved per element; on an H200, 4.1 TB/s for f32 ->
// bf16 and 3.9 TB/s for bf16 -> f32 (128 Mi elements).
template <class To, class From>
__global__ void convert_kernel(const From* __restrict__ s, To* __restrict__ d, std::int64_t n,
                               bool vec) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t head = 0;
  if (vec) {
    const std::int64_t packs = n / kVec;
    const auto* sp = reinterpret_cast<const Pack<From>*>(s);
    auto* dp = reinterpret_cast<Pack<To>*>(d);
    for (std::int64_t i = t; i < packs; i += stride) {
      const Pack<From> a = sp[i];
      Pack<To> b;
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        b.v[k] = cast_one<To>(a.v[k]);
      dp[i] = b;
    }
    head = packs * kVec;
  }
  for (std::int64_t i = head + t; i < n; i += stride)
    d[i] = cast_one<To>(s[i]);
}

void copy_bytes_d2d(const void* src, void* dst, std::size_t nbytes, cudaStream_t stream) {
  if (nbytes > 0)
    DISTJAX_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream), "copy",
                       nbytes, " bytes");
}

void convert(const void* src, DType from, void* dst, DType to, std::int64_t n, Stream s) {
  if (n <= 0) return;
  const cudaStream_t stream = stream_of(s);
  // The same dtype is a copy, but for bf16: the CPU takes it through f32, which quiets a
  // signalling NaN (its f16 round trip, through _Float16, compiles to a copy).
  if (from == to && from != DType::BF16)
    return copy_bytes_d2d(src, dst, static_cast<std::size_t>(n) * dtype_size(from), stream);
  visit_device_dtype(from, [&](auto from_tag) {
    using From = typename decltype(from_tag)::type;
    visit_device_dtype(to, [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      const bool vec = aligned(src, sizeof(Pack<From>)) && aligned(dst, sizeof(Pack<To>));
      convert_kernel<To, From><<<grid_for(vec ? n / kVec + 1 : n), kThreads, 0, stream>>>(
          static_cast<const From*>(src), static_cast<To*>(dst), n, vec);
      DISTJAX_CUDA_LAUNCHED("convert");
    });
  });
}

// ---------------------------------------------------------------- copies
// Row r's units j < row_units: dst[r * dst_stride + j] = src[r * src_stride + j] (strides in
// units of U), one thread per unit over all rows. Bound: 2 * row_bytes * rows bytes moved;
// on an H200 with 16-byte units 3.3-3.9 TB/s for rows of 96 B to 32 KiB, where
// cudaMemcpy2DAsync reached 1.4-2.7 TB/s.
template <class U>
__global__ void copy_2d_kernel(const U* __restrict__ src, std::int64_t src_stride,
                               U* __restrict__ dst, std::int64_t dst_stride, std::int64_t row_units,
                               std::int64_t total) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const std::int64_t r = i / row_units, j = i - r * row_units;
    dst[r * dst_stride + j] = src[r * src_stride + j];
  }
}

template <class U>
void launch_copy_2d(const void* src, std::size_t src_stride, void* dst, std::size_t dst_stride,
                    std::size_t row_bytes, std::int64_t rows, cudaStream_t stream) {
  const auto row_units = static_cast<std::int64_t>(row_bytes / sizeof(U));
  const std::int64_t total = row_units * rows;
  copy_2d_kernel<U><<<grid_for(total), kThreads, 0, stream>>>(
      static_cast<const U*>(src), static_cast<std::int64_t>(src_stride / sizeof(U)),
      static_cast<U*>(dst), static_cast<std::int64_t>(dst_stride / sizeof(U)), row_units, total);
  DISTJAX_CUDA_LAUNCHED("copy_2d");
}

// The largest pitch cudaMemcpy2DAsync accepts on the GPUs this backend targets
// (cudaDevAttrMaxPitch is 2^31 - 1 on Hopper).
constexpr std::size_t kMaxPitch = 2147483647u;

// One run: cudaMemcpyAsync. Runs whose addresses, strides and length are multiples of 4
// bytes: the kernel in the widest such unit. Others (byte-aligned runs): cudaMemcpy2DAsync
// where it takes the strides, else the kernel in bytes or halves.
void copy_2d(const void* src, std::size_t src_stride, void* dst, std::size_t dst_stride,
             std::size_t row_bytes, std::int64_t rows) {
  if (rows <= 0 || row_bytes == 0) return;
  const cudaStream_t stream = thread_stream();
  if (rows == 1 || (src_stride == row_bytes && dst_stride == row_bytes))
    return copy_bytes_d2d(src, dst, row_bytes * static_cast<std::size_t>(rows), stream);
  const std::size_t unit =
      unit_of({reinterpret_cast<std::uintptr_t>(src), reinterpret_cast<std::uintptr_t>(dst),
               src_stride, dst_stride, row_bytes});
  if (unit < 4 && src_stride >= row_bytes && dst_stride >= row_bytes && src_stride <= kMaxPitch &&
      dst_stride <= kMaxPitch) {
    DISTJAX_CUDA_CHECK(
        cudaMemcpy2DAsync(dst, dst_stride, src, src_stride, row_bytes,
                          static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice, stream),
        "copy_2d", rows, " rows of ", row_bytes, " bytes, strides ", src_stride, " -> ",
        dst_stride);
    return;
  }
  switch (unit) {
    case 16:
      return launch_copy_2d<U16>(src, src_stride, dst, dst_stride, row_bytes, rows, stream);
    case 8:
      return launch_copy_2d<std::uint64_t>(src, src_stride, dst, dst_stride, row_bytes, rows,
                                           stream);
    case 4:
      return launch_copy_2d<std::uint32_t>(src, src_stride, dst, dst_stride, row_bytes, rows,
                                           stream);
    case 2:
      return launch_copy_2d<std::uint16_t>(src, src_stride, dst, dst_stride, row_bytes, rows,
                                           stream);
    default:
      return launch_copy_2d<std::uint8_t>(src, src_stride, dst, dst_stride, row_bytes, rows,
                                          stream);
  }
}

// Host-to-device copies up to kStagedMax bytes (the loaders' batches, small tensors) go
// through page-locked staging slots and return without waiting for the stream: the host's
// bytes are copied into a free slot, the slot's transfer is queued on the stream, and an
// event on the stream marks when the slot is free again. A copy from pageable memory would
// make the host wait for all the stream's earlier work (a stall per training step). Larger
// copies (checkpoints, whole parameter sets) go straight from pageable memory and wait.
constexpr std::size_t kStagedMax = std::size_t(16) << 20;
constexpr std::size_t kStagingSlots = 64;  // beyond this many, a copy waits for a busy slot

struct StagingSlot {
  void* p = nullptr;
  std::size_t bytes = 0;
  cudaEvent_t done = nullptr;  // recorded after the slot's last transfer
};

class Staging {
 public:
  // A slot of at least n bytes whose last transfer is done (the caller owns it until give):
  // a free one, a new one, or, with kStagingSlots in flight, the first that fits once done.
  StagingSlot take(std::size_t n) {
    std::unique_lock lk(mu_);
    std::size_t pending = free_.size();  // the first fitting slot still in flight
    for (std::size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].bytes < n) continue;
      const cudaError_t q = cudaEventQuery(free_[i].done);
      if (q == cudaSuccess) return pop(i);
      DISTJAX_CUDA_CHECK(q == cudaErrorNotReady ? cudaSuccess : q, "from_host", "staging slot");
      (void)cudaGetLastError();  // "not ready" is no error: leave none behind
      if (pending == free_.size()) pending = i;
    }
    if (pending < free_.size() && free_.size() >= kStagingSlots) {
      const StagingSlot slot = pop(pending);
      lk.unlock();
      DISTJAX_CUDA_CHECK(cudaEventSynchronize(slot.done), "from_host", "staging slot");
      return slot;
    }
    lk.unlock();
    StagingSlot slot;
    slot.bytes = std::max<std::size_t>(n, std::size_t(64) << 10);
    DISTJAX_CUDA_CHECK(cudaHostAlloc(&slot.p, slot.bytes, cudaHostAllocPortable), "from_host",
                       slot.bytes, " bytes of page-locked staging memory");
    DISTJAX_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming), "from_host");
    return slot;
  }

  void give(const StagingSlot& slot) {
    std::lock_guard lk(mu_);
    free_.push_back(slot);
  }

 private:
  StagingSlot pop(std::size_t i) {
    StagingSlot slot = free_[i];
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
    return slot;
  }

  std::mutex mu_;
  std::vector<StagingSlot> free_;
};

Staging& staging() {
  static auto* s = new Staging;  // never destroyed: transfers may be in flight at exit
  return *s;
}

// to_host waits for the stream, so host_dst is written on return.
void to_host(const void* src, void* host_dst, std::size_t nbytes) {
  if (nbytes == 0) return;
  const cudaStream_t stream = thread_stream();
  DISTJAX_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, nbytes, cudaMemcpyDeviceToHost, stream),
                     "to_host", nbytes, " bytes");
  DISTJAX_CUDA_CHECK(cudaStreamSynchronize(stream), "to_host");
}

void from_host(const void* host_src, void* dst, std::size_t nbytes) {
  if (nbytes == 0) return;
  const cudaStream_t stream = thread_stream();
  if (nbytes <= kStagedMax) {
    StagingSlot slot = staging().take(nbytes);
    std::memcpy(slot.p, host_src, nbytes);
    cudaError_t err = cudaMemcpyAsync(dst, slot.p, nbytes, cudaMemcpyHostToDevice, stream);
    if (err == cudaSuccess) err = cudaEventRecord(slot.done, stream);
    staging().give(slot);  // free again once `done` completes
    DISTJAX_CUDA_CHECK(err, "from_host", nbytes, " bytes");
    return;
  }
  DISTJAX_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, nbytes, cudaMemcpyHostToDevice, stream),
                     "from_host", nbytes, " bytes");
  DISTJAX_CUDA_CHECK(cudaStreamSynchronize(stream), "from_host");
}

}  // namespace

const detail::CopyKernels copy_kernels{
    .fill = fill,
    .convert = convert,
    .copy_2d = copy_2d,
    .to_host = to_host,
    .from_host = from_host,
};

}  // namespace distjax::tensor::cuda
