// Kernel family: what the parallel layers compute on sharded data: the box of a sharded
// array's shard, vocabulary-parallel ids and one-hot labels, pmax's owner masks and the
// gradient norm's f64 sum of squares. Plain arguments only: pointers, sizes, dtypes, a
// small descriptor of a box and host memory for a kernel's report (a value a
// host decision reads at once).
#pragma once

#include <cstddef>
#include <cstdint>

#include "distjax/core/dtype.hpp"

namespace distjax::tensor::detail {

/// A box of a row-major array: `rank` dimensions of `shape` elements starting at element
/// index `offset` of an array with element strides `strides` (pointers to `rank` values in
/// host memory).
struct BoxPlan {
  int rank = 0;
  const std::int64_t* shape = nullptr;
  const std::int64_t* offset = nullptr;
  const std::int64_t* strides = nullptr;
  std::size_t elem_bytes = 0;
};

/// What an id kernel found outside [0, bound): how many, and the first in element order.
struct IdReport {
  std::int64_t bad = 0;
  std::int64_t first = 0;
};

struct ShardKernels {
  /// Copies between the box `plan` of `global` and the contiguous `local` (the box's shape,
  /// row-major): into local when to_local, else back into the box.
  void (*copy_box)(void* global, void* local, const BoxPlan& plan, bool to_local);
  /// Vocabulary-parallel lookup of n ids (i32 or i64) against rows [lo, lo + rows):
  /// local[i] = id - lo and keep[i] = 1 for an id in that range, else 0 and 0. With bound
  /// >= 0, ids outside [0, bound) are counted into *host_report.
  void (*shard_ids)(const void* ids, DType dtype, std::int64_t n, std::int64_t lo,
                    std::int64_t rows, std::int64_t bound, std::int64_t* local, float* keep,
                    IdReport* host_report);
  /// Vocabulary-parallel one-hot: for each of n labels (i32 or i64) in [lo, lo + width),
  /// out[i * width + label - lo] = 1 (out is zero otherwise, as given). Labels outside
  /// [0, bound) are counted into *host_report.
  void (*shard_one_hot)(const void* labels, DType dtype, std::int64_t n, std::int64_t lo,
                        std::int64_t width, std::int64_t bound, float* out, IdReport* host_report);
  /// out[i] = a[i] == b[i] ? value : 0 for i < n (f32); b_scalar: b[0] for every i.
  void (*select_equal)(const float* a, const float* b, bool b_scalar, float value, float* out,
                       std::int64_t n);
  /// *host_out = sum of x[i]^2 over i < n in f64, in one fixed order, so equal values give
  /// equal bits on every device: x is cut into chunks of kSquaresChunk elements; in each,
  /// lane k (0..7) adds the squares of the chunk's elements j with j % 8 == k in order, and
  /// the chunk's partial is ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)); the partials
  /// are added in chunk order. (Chunks let a GPU run them side by side; the lanes let a CPU
  /// vectorize without reassociating.)
  void (*sum_squares_f64)(const float* x, std::int64_t n, double* host_out);
  /// host_out[i] = sum_squares_f64 of xs[i] (ns[i] elements) for i < count, the same bits,
  /// with one wait for all (a GPU: one host sync, not one per leaf).
  void (*sum_squares_f64_many)(const float* const* xs, const std::int64_t* ns, std::int64_t count,
                               double* host_out);
};

/// The chunk of ShardKernels::sum_squares_f64's order.
inline constexpr std::int64_t kSquaresChunk = 8192;

}  // namespace distjax::tensor::detail
