// CPU kernels: permutation and broadcasting copies.
#include <algorithm>
#include <cstring>

#include "distjax/tensor/cpu/grain.hpp"
#include "distjax/tensor/cpu/kernels.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

void permute(const void* src_v, void* dst_v, std::size_t es, const PermutePlan& p, std::int64_t n) {
  const int r = p.rank;
  const std::int64_t* os = p.dims;
  const std::int64_t* st = p.strides;
  const char* src = static_cast<const char*>(src_v);
  char* dst = static_cast<char*>(dst_v);
  // Iterate the output in order over all but its last dim; copy the last dim with its stride.
  const std::int64_t last = r ? os[r - 1] : 1, last_stride = r ? st[r - 1] : 1;
  const std::int64_t rows = r ? n / std::max<std::int64_t>(last, 1) : 1;
#pragma omp parallel for if (n > kParallelGrainMemory)
  for (std::int64_t row = 0; row < rows; ++row) {
    std::int64_t rem = row, off = 0;
    for (int d = r - 2; d >= 0; --d) {
      off += (rem % os[d]) * st[d];
      rem /= os[d];
    }
    char* o = dst + row * last * es;
    if (last_stride == 1) {  // the innermost dimension stays innermost: copy whole rows
      std::memcpy(o, src + off * es, static_cast<std::size_t>(last) * es);
    } else if (es == 4) {
      const float* s = reinterpret_cast<const float*>(src) + off;
      float* of = reinterpret_cast<float*>(o);
      for (std::int64_t j = 0; j < last; ++j)
        of[j] = s[j * last_stride];
    } else {
      for (std::int64_t j = 0; j < last; ++j)
        std::memcpy(o + j * es, src + (off + j * last_stride) * es, es);
    }
  }
}

void broadcast(const float* px, const BroadcastPlan& q, float* po, std::int64_t n) {
  using K = BroadcastPlan::Kind;
  switch (q.kind) {
    case K::Same:
      std::memcpy(po, px, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case K::Scalar:
      std::fill(po, po + n, px[0]);
      return;
    case K::Row:
#pragma omp parallel for if (n > kParallelGrainMemory)
      for (std::int64_t r = 0; r < q.outer; ++r)
        std::memcpy(po + r * q.inner, px, static_cast<std::size_t>(q.inner) * sizeof(float));
      return;
    case K::Col:
#pragma omp parallel for if (n > kParallelGrainMemory)
      for (std::int64_t r = 0; r < q.outer; ++r)
        std::fill(po + r * q.inner, po + (r + 1) * q.inner, px[r]);
      return;
    default: {
      // General: per run of the output's last dimension, either a row copy (the operand
      // keeps that dimension) or a fill (it broadcasts it).
      const std::int64_t last = q.rank == 0 ? 1 : q.dims[q.rank - 1];
      const bool keeps_last = q.rank > 0 && q.strides[q.rank - 1] != 0;
      const std::int64_t rows = last ? n / last : 0;
#pragma omp parallel for if (n > kParallelGrainMemory)
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t src = broadcast_index(q, r * last);
        if (keeps_last)
          std::memcpy(po + r * last, px + src, static_cast<std::size_t>(last) * sizeof(float));
        else
          std::fill(po + r * last, po + (r + 1) * last, px[src]);
      }
    }
  }
}

}  // namespace

const ShapeKernels shape_kernels{
    .permute = permute,
    .broadcast = broadcast,
};

}  // namespace distjax::tensor::detail::cpu
