// CPU kernels of the parallel layers: shard boxes, vocabulary-parallel ids and one-hot
// labels, pmax's owner masks, the gradient norm's sum of squares.
#include <cstring>
#include <vector>

#include "distjax/tensor/cpu/kernels.hpp"

namespace distjax::tensor::detail::cpu {
namespace {

// Row-major, innermost rows with memcpy; an odometer over the outer dimensions.
void copy_box(void* global, void* local, const BoxPlan& plan, bool to_local) {
  const std::size_t es = plan.elem_bytes;
  char* g = static_cast<char*>(global);
  char* l = static_cast<char*>(local);
  const int rank = plan.rank;
  std::int64_t count = 1;
  for (int d = 0; d < rank; ++d)
    count *= plan.shape[d];
  if (rank == 0 || count == 0) {
    if (count != 0) to_local ? std::memcpy(l, g, es) : std::memcpy(g, l, es);
    return;
  }
  const std::int64_t row = plan.shape[rank - 1];
  const std::int64_t rows = count / row;
  std::vector<std::int64_t> idx(rank, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t goff = 0;
    for (int d = 0; d < rank; ++d)
      goff += (plan.offset[d] + idx[d]) * plan.strides[d];
    char* gp = g + goff * es;
    char* lp = l + r * row * es;
    to_local ? std::memcpy(lp, gp, row * es) : std::memcpy(gp, lp, row * es);
    for (int d = rank - 2; d >= 0; --d) {  // next row
      if (++idx[d] < plan.shape[d]) break;
      idx[d] = 0;
    }
  }
}

template <class T>
void shard_ids_of(const T* ids, std::int64_t n, std::int64_t lo, std::int64_t rows,
                  std::int64_t bound, std::int64_t* local, float* keep, IdReport* report) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t id = ids[i];
    if (bound >= 0 && (id < 0 || id >= bound) && report->bad++ == 0) report->first = id;
    const bool mine = id >= lo && id < lo + rows;
    local[i] = mine ? id - lo : 0;
    keep[i] = mine ? 1.f : 0.f;
  }
}

void shard_ids(const void* ids, DType dtype, std::int64_t n, std::int64_t lo, std::int64_t rows,
               std::int64_t bound, std::int64_t* local, float* keep, IdReport* report) {
  *report = {};
  if (dtype == DType::I32) {
    shard_ids_of(static_cast<const std::int32_t*>(ids), n, lo, rows, bound, local, keep, report);
  } else {
    shard_ids_of(static_cast<const std::int64_t*>(ids), n, lo, rows, bound, local, keep, report);
  }
}

template <class T>
void shard_one_hot_of(const T* labels, std::int64_t n, std::int64_t lo, std::int64_t width,
                      std::int64_t bound, float* out, IdReport* report) {
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t y = labels[r];
    if ((y < 0 || y >= bound) && report->bad++ == 0) report->first = y;
    if (y >= lo && y < lo + width) out[r * width + (y - lo)] = 1.f;
  }
}

void shard_one_hot(const void* labels, DType dtype, std::int64_t n, std::int64_t lo,
                   std::int64_t width, std::int64_t bound, float* out, IdReport* report) {
  *report = {};
  if (dtype == DType::I32) {
    shard_one_hot_of(static_cast<const std::int32_t*>(labels), n, lo, width, bound, out, report);
  } else {
    shard_one_hot_of(static_cast<const std::int64_t*>(labels), n, lo, width, bound, out, report);
  }
}

void select_equal(const float* a, const float* b, bool b_scalar, float value, float* out,
                  std::int64_t n) {
  if (b_scalar) {
    const float v = b[0];
    for (std::int64_t i = 0; i < n; ++i)
      out[i] = a[i] == v ? value : 0.f;
  } else {
    for (std::int64_t i = 0; i < n; ++i)
      out[i] = a[i] == b[i] ? value : 0.f;
  }
}

// The table's order (parallel.hpp): per chunk, independent lanes that vectorize without
// reassociation (one chain ran at the add latency, ~3% of a data-parallel GPT step).
void sum_squares_f64(const float* p, std::int64_t n, double* out) {
  constexpr int kLanes = 8;
  double total = 0.0;
  for (std::int64_t c = 0; c < n; c += kSquaresChunk) {
    const float* q = p + c;
    const std::int64_t m = std::min(kSquaresChunk, n - c);
    double acc[kLanes] = {};
    std::int64_t i = 0;
    for (; i + kLanes <= m; i += kLanes)
      for (int k = 0; k < kLanes; ++k)
        acc[k] += static_cast<double>(q[i + k]) * q[i + k];
    for (int k = 0; i < m; ++i, ++k)
      acc[k] += static_cast<double>(q[i]) * q[i];
    total += ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
  *out = total;
}

void sum_squares_f64_many(const float* const* xs, const std::int64_t* ns, std::int64_t count,
                          double* out) {
  for (std::int64_t i = 0; i < count; ++i)
    sum_squares_f64(xs[i], ns[i], out + i);
}

}  // namespace

const ShardKernels shard_kernels{
    .copy_box = copy_box,
    .shard_ids = shard_ids,
    .shard_one_hot = shard_one_hot,
    .select_equal = select_equal,
    .sum_squares_f64 = sum_squares_f64,
    .sum_squares_f64_many = sum_squares_f64_many,
};

}  // namespace distjax::tensor::detail::cpu
