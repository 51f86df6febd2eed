// The CPU's communication kernels (table/comm.hpp): the rank-order reduction (with an
// AVX-512 path for f32 that streams large destinations to memory), zero fills, and no-op
// waits and events, since CPU kernels run at once.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cpu/kernels.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace distjax::tensor::detail::cpu {

namespace {

constexpr std::int64_t kTile = 1024;

// Every dtype: accumulate a tile in rank order (halves in f32), then store it once.
template <class T, class Acc>
void reduce_generic(T* dst, const void* const* srcs, int k, std::int64_t n, RankReduce op,
                    int divisor) {
  Acc acc[kTile];
  for (std::int64_t lo = 0; lo < n; lo += kTile) {
    const std::int64_t m = std::min(kTile, n - lo);
    const T* s0 = static_cast<const T*>(srcs[0]) + lo;
    for (std::int64_t i = 0; i < m; ++i)
      acc[i] = static_cast<Acc>(s0[i]);
    for (int j = 1; j < k; ++j) {
      const T* s = static_cast<const T*>(srcs[j]) + lo;
      for (std::int64_t i = 0; i < m; ++i) {
        const Acc v = static_cast<Acc>(s[i]);
        acc[i] = op == RankReduce::Max ? (v > acc[i] ? v : acc[i]) : acc[i] + v;
      }
    }
    for (std::int64_t i = 0; i < m; ++i)
      dst[lo + i] = T(op == RankReduce::Mean ? acc[i] / static_cast<Acc>(divisor) : acc[i]);
  }
}

#if defined(__AVX512F__)
// Destinations of at least this many bytes are written with non-temporal stores: they
// exceed what the caches could keep for the reader anyway, and streaming them skips
// the read-for-ownership of every destination line (a third of the reduction's traffic).
constexpr std::int64_t kStreamBytes = std::int64_t(8) << 20;

// One element, in rank order: the arithmetic of reduce_generic.
inline float reduce_one(const float* const* s, int k, std::int64_t i, RankReduce op, float div) {
  float acc = s[0][i];
  for (int j = 1; j < k; ++j) {
    const float v = s[j][i];
    acc = op == RankReduce::Max ? (v > acc ? v : acc) : acc + v;
  }
  return op == RankReduce::Mean ? acc / div : acc;
}

// 16 elements at i. max_ps(v, acc) is (v > acc ? v : acc), like the scalar fold (the
// masked form avoids a g++ 12 -Wmaybe-uninitialized false positive in the unmasked one);
// vector add and divide round exactly like the scalar ones.
template <RankReduce Op>
inline __m512 reduce_vec(const float* const* s, int k, std::int64_t i, __m512 div) {
  __m512 acc = _mm512_loadu_ps(s[0] + i);
  for (int j = 1; j < k; ++j) {
    const __m512 v = _mm512_loadu_ps(s[j] + i);
    acc = Op == RankReduce::Max ? _mm512_mask_max_ps(acc, __mmask16(0xFFFF), v, acc)
                                : _mm512_add_ps(acc, v);
  }
  return Op == RankReduce::Mean ? _mm512_div_ps(acc, div) : acc;
}

template <RankReduce Op, bool Stream>
void reduce_f32_body(float* d, const float* const* s, int k, std::int64_t i, std::int64_t n,
                     float divisor) {
  const __m512 div = _mm512_set1_ps(divisor);
  for (; i + 64 <= n; i += 64) {  // four vectors (one cache line each) per iteration
    const __m512 a = reduce_vec<Op>(s, k, i, div), b = reduce_vec<Op>(s, k, i + 16, div);
    const __m512 c = reduce_vec<Op>(s, k, i + 32, div), e = reduce_vec<Op>(s, k, i + 48, div);
    if (Stream) {
      _mm512_stream_ps(d + i, a);
      _mm512_stream_ps(d + i + 16, b);
      _mm512_stream_ps(d + i + 32, c);
      _mm512_stream_ps(d + i + 48, e);
    } else {
      _mm512_store_ps(d + i, a);
      _mm512_store_ps(d + i + 16, b);
      _mm512_store_ps(d + i + 32, c);
      _mm512_store_ps(d + i + 48, e);
    }
  }
  for (; i + 16 <= n; i += 16) {
    const __m512 a = reduce_vec<Op>(s, k, i, div);
    if (Stream) {
      _mm512_stream_ps(d + i, a);
    } else {
      _mm512_store_ps(d + i, a);
    }
  }
  if (Stream) _mm_sfence();  // the streamed lines are visible before the next sync point
  for (; i < n; ++i)
    d[i] = reduce_one(s, k, i, Op, divisor);
}

template <RankReduce Op>
void reduce_f32(float* d, const float* const* s, int k, std::int64_t n, float divisor) {
  // Scalar head up to a 64-byte aligned destination, then aligned vector stores.
  std::int64_t i = 0;
  while (i < n && (reinterpret_cast<std::uintptr_t>(d + i) & 63) != 0) {
    d[i] = reduce_one(s, k, i, Op, divisor);
    ++i;
  }
  if (n * static_cast<std::int64_t>(sizeof(float)) >= kStreamBytes) {
    reduce_f32_body<Op, true>(d, s, k, i, n, divisor);
  } else {
    reduce_f32_body<Op, false>(d, s, k, i, n, divisor);
  }
}
#endif

void zero(void* dst, std::size_t nbytes) {
  if (nbytes > 0) std::memset(dst, 0, nbytes);
}

void synchronize() {}
// Kernels run at once here: no event is ever made, so the table has no entries to wait
// for, test or release one.
void* event_record() {
  return nullptr;
}

void to_host_async(const void* src, void* host_dst, std::size_t nbytes) {
  if (nbytes > 0) std::memcpy(host_dst, src, nbytes);
}

void* host_alloc(std::size_t nbytes) {
  void* p = std::malloc(nbytes > 0 ? nbytes : 1);
  DISTJAX_CHECK(p != nullptr, Error, "[host_alloc] out of host memory for ", nbytes, " bytes");
  return p;
}
void host_free(void* p, std::size_t) {
  std::free(p);
}

}  // namespace

void reduce_ranks_generic(void* dst, const void* const* srcs, int k, std::int64_t n, DType dtype,
                          RankReduce op, int divisor) {
  switch (dtype) {
    case DType::F32:
      return reduce_generic<float, float>(static_cast<float*>(dst), srcs, k, n, op, divisor);
    case DType::F64:
      return reduce_generic<double, double>(static_cast<double*>(dst), srcs, k, n, op, divisor);
    case DType::I32:
      return reduce_generic<std::int32_t, std::int32_t>(static_cast<std::int32_t*>(dst), srcs, k, n,
                                                        op, divisor);
    case DType::I64:
      return reduce_generic<std::int64_t, std::int64_t>(static_cast<std::int64_t*>(dst), srcs, k, n,
                                                        op, divisor);
    case DType::BF16:
      return reduce_generic<bf16, float>(static_cast<bf16*>(dst), srcs, k, n, op, divisor);
    case DType::F16:
      return reduce_generic<f16, float>(static_cast<f16*>(dst), srcs, k, n, op, divisor);
  }
}

namespace {

void reduce_ranks_one(void* dst, const void* const* srcs, int k, std::int64_t n, DType dtype,
                      RankReduce op, int divisor) {
#if defined(__AVX512F__)
  if (dtype == DType::F32 && k >= 1 && k <= kMaxRankSources) {
    const float* s[kMaxRankSources];
    for (int j = 0; j < k; ++j)
      s[j] = static_cast<const float*>(srcs[j]);
    float* d = static_cast<float*>(dst);
    const float div = static_cast<float>(divisor);
    switch (op) {
      case RankReduce::Sum:
        return reduce_f32<RankReduce::Sum>(d, s, k, n, div);
      case RankReduce::Mean:
        return reduce_f32<RankReduce::Mean>(d, s, k, n, div);
      case RankReduce::Max:
        return reduce_f32<RankReduce::Max>(d, s, k, n, div);
    }
  }
#endif
  reduce_ranks_generic(dst, srcs, k, n, dtype, op, divisor);
}

}  // namespace

// The fold into the first destination, then copies of it: every source is read before the
// first copy, so a later destination may alias a source too.
void reduce_ranks(void* const* dsts, int m, const void* const* srcs, int k, std::int64_t n,
                  DType dtype, RankReduce op, int divisor) {
  DISTJAX_CHECK(m >= 1 && m <= kMaxRankSources && k >= 1 && k <= kMaxRankSources, InvalidArgument,
                "[reduce_ranks] folds 1 to ", kMaxRankSources,
                " sources into as many destinations, got ", k, " into ", m);
  reduce_ranks_one(dsts[0], srcs, k, n, dtype, op, divisor);
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dtype);
  for (int j = 1; j < m; ++j)
    if (dsts[j] != dsts[0]) std::memcpy(dsts[j], dsts[0], bytes);
}

const MemoryKernels memory_kernels{
    .zero = zero,
    .reduce_ranks = reduce_ranks,
    .synchronize = synchronize,
    .event_record = event_record,
    .event_wait = nullptr,
    .event_done = nullptr,
    .event_stream_wait = nullptr,
    .event_release = nullptr,
    .to_host_async = to_host_async,
    .host_alloc = host_alloc,
    .host_free = host_free,
};

}  // namespace distjax::tensor::detail::cpu
