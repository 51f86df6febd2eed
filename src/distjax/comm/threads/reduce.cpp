// The threads backend's reduction kernel (see reduce.hpp).
#include "distjax/comm/threads/reduce.hpp"

#include <cstdint>

#include "distjax/comm/detail/call.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace distjax::comm::threads {

namespace {

// One element, in rank order: the arithmetic of detail::reduce_into.
inline float reduce_one(const float* const* s, int k, std::int64_t i, ReduceOp op, float div) {
  float acc = s[0][i];
  for (int j = 1; j < k; ++j) {
    const float v = s[j][i];
    acc = op == ReduceOp::Max ? (v > acc ? v : acc) : acc + v;
  }
  return op == ReduceOp::Mean ? acc / div : acc;
}

#if defined(__AVX512F__)
// 16 elements at i. max_ps(v, acc) is (v > acc ? v : acc), like the scalar fold (the
// masked form avoids a g++ 12 -Wmaybe-uninitialized false positive in the unmasked one);
// vector add and divide round exactly like the scalar ones.
template <ReduceOp Op>
inline __m512 reduce_vec(const float* const* s, int k, std::int64_t i, __m512 div) {
  __m512 acc = _mm512_loadu_ps(s[0] + i);
  for (int j = 1; j < k; ++j) {
    const __m512 v = _mm512_loadu_ps(s[j] + i);
    acc = Op == ReduceOp::Max ? _mm512_mask_max_ps(acc, __mmask16(0xFFFF), v, acc)
                              : _mm512_add_ps(acc, v);
  }
  return Op == ReduceOp::Mean ? _mm512_div_ps(acc, div) : acc;
}

template <ReduceOp Op, bool Stream>
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

template <ReduceOp Op>
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

}  // namespace

void reduce_rank_order(void* dst, const void* const* srcs, int k, std::int64_t n, DType dtype,
                       ReduceOp op, int divisor) {
#if defined(__AVX512F__)
  if (dtype == DType::F32 && k >= 1 && k <= 64) {
    const float* s[64];
    for (int j = 0; j < k; ++j)
      s[j] = static_cast<const float*>(srcs[j]);
    float* d = static_cast<float*>(dst);
    const float div = static_cast<float>(divisor);
    switch (op) {
      case ReduceOp::Sum:
        return reduce_f32<ReduceOp::Sum>(d, s, k, n, div);
      case ReduceOp::Mean:
        return reduce_f32<ReduceOp::Mean>(d, s, k, n, div);
      case ReduceOp::Max:
        return reduce_f32<ReduceOp::Max>(d, s, k, n, div);
    }
  }
#endif
  detail::reduce_into(dst, srcs, k, n, dtype, op, divisor);
}

}  // namespace distjax::comm::threads
