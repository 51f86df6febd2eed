// In-place tensor functions: copies into existing tensors (views of buckets, shards and
// boxes), accumulation, and GEMMs on sub-blocks. They write the memory of their first
// argument (a handle, const like every Tensor argument), run on their tensors' device
// through the kernel table and are not recorded on the tape.
#pragma once

#include <cstdint>
#include <vector>

#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

/// dst = src element for element in row-major order: same dtype and number of elements
/// (the shapes may differ), one device. dst is usually a view, e.g. of a bucket:
///   copy_into(bucket.view_rows(at, at + g.numel()), g);
void copy_into(const Tensor& dst, const Tensor& src);

/// Runs of elements in a tensor's flat row-major elements: run r starts at element
/// offset + r * stride.
struct Rows {
  std::int64_t offset = 0;
  std::int64_t stride = 0;
};

/// Copies `rows` runs of `cols` elements from src's runs `from` into dst's runs `to`:
/// same dtype, one device, every run inside its tensor. The packing of per-device chunks
/// into rank-major blocks and back (ZeRO's buckets).
void copy_rows_into(const Tensor& dst, Rows to, const Tensor& src, Rows from, std::int64_t rows,
                    std::int64_t cols);

/// dst += src element for element: f32, same number of elements, no overlap (a gradient
/// accumulated across micro-batches).
void add_into(const Tensor& dst, const Tensor& src);

/// x *= scale in place: `scale` one f32 value on x's device (e.g. a cotangent), x f32, bf16
/// or f16 (each element widened, multiplied in f32 and rounded back).
void scale_into(const Tensor& x, const Tensor& scale);

/// c = op(a) op(b), or with `accumulate` c += op(a) op(b), written straight into c: op(a)
/// M x K (a stored (K, M) with trans_a), op(b) K x N (b (N, K) with trans_b), both f32, both
/// bf16 or both f16 (matmul's operands, f32 accumulation); c (M, N), f32 or, without
/// `accumulate`, the operands' dtype (rounded once). c may be a view (a block of rows).
/// With `accumulate` the product adds into c in the GEMM itself (cuBLASLt's C with beta =
/// 1), without a product tensor of its own: a gradient summed over chunks.
void matmul_into(const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                 bool accumulate = false);

/// A row-major matrix inside a tensor's flat elements: its first element `offset`, `ld`
/// elements between the starts of its rows.
struct Block {
  std::int64_t offset = 0;
  std::int64_t ld = 0;
};

/// c's block = alpha * op(a's block) op(b's block) + beta * c's block, all f32 on one
/// device: op(A) is m x k (stored k x m when trans_a), op(B) k x n (stored n x k when
/// trans_b), C m x n; every block inside its tensor. With beta = 1 the product accumulates
/// into C (a ring's partial products into one buffer); a block of columns reads a weight
/// shard in place.
void gemm_into(const Tensor& c, Block cb, const Tensor& a, Block ab, bool trans_a, const Tensor& b,
               Block bb, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha = 1.f, float beta = 0.f);

/// local = the box of `global` starting at index `offset` (one per dimension) with local's
/// shape; same dtype and rank, one device (device_put's shards).
void copy_from_box(const Tensor& local, const Tensor& global,
                   const std::vector<std::int64_t>& offset);
/// The box of `global` starting at `offset` with local's shape = local (gather's blocks).
void copy_to_box(const Tensor& global, const std::vector<std::int64_t>& offset,
                 const Tensor& local);

}  // namespace distjax::tensor
