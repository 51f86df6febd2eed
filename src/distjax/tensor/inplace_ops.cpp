#include "distjax/tensor/inplace_ops.hpp"

#include "distjax/core/error.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {

using detail::Dispatch;
using detail::KernelTable;

namespace {

void check_pair(const char* op, const Tensor& dst, const Tensor& src) {
  check_defined(dst, op, "dst");
  check_defined(src, op, "src");
  DISTJAX_CHECK(dst.dtype() == src.dtype(), InvalidArgument, "[", op, "] dst is ",
                dtype_name(dst.dtype()), " but src is ", dtype_name(src.dtype()));
}

// Runs of `rows` x `cols` elements at `at` inside t (nothing when rows or cols is 0).
void check_runs(const char* op, const char* what, const Tensor& t, Rows at, std::int64_t rows,
                std::int64_t cols) {
  DISTJAX_CHECK(rows >= 0 && cols >= 0, InvalidArgument, "[", op, "] ", rows, " runs of ", cols,
                " elements");
  if (rows == 0 || cols == 0) return;
  DISTJAX_CHECK(at.offset >= 0 && (rows == 1 || at.stride >= cols) &&
                    at.offset + (rows - 1) * at.stride + cols <= t.numel(),
                InvalidArgument, "[", op, "] ", rows, " runs of ", cols, " elements at offset ",
                at.offset, ", stride ", at.stride, " do not fit ", what, " of ", t.numel(),
                " elements");
}

bool overlap(const Tensor& a, const Tensor& b) {
  if (!a.shares_storage_with(b) || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace

void copy_into(const Tensor& dst, const Tensor& src) {
  check_pair("copy_into", dst, src);
  DISTJAX_CHECK(dst.numel() == src.numel(), InvalidArgument, "[copy_into] dst ",
                to_string(dst.shape()), " and src ", to_string(src.shape()),
                " hold different numbers of elements");
  Dispatch k("copy_into", &KernelTable::copy, {&src, &dst});
  k->copy_2d(src.raw_data(), src.nbytes(), dst.raw_data(), dst.nbytes(), src.nbytes(), 1);
}

void copy_rows_into(const Tensor& dst, Rows to, const Tensor& src, Rows from, std::int64_t rows,
                    std::int64_t cols) {
  check_pair("copy_rows_into", dst, src);
  check_runs("copy_rows_into", "dst", dst, to, rows, cols);
  check_runs("copy_rows_into", "src", src, from, rows, cols);
  if (rows == 0 || cols == 0) return;
  const std::size_t es = dtype_size(src.dtype());
  Dispatch k("copy_rows_into", &KernelTable::copy, {&src, &dst});
  k->copy_2d(static_cast<const char*>(src.raw_data()) + from.offset * es, from.stride * es,
             static_cast<char*>(dst.raw_data()) + to.offset * es, to.stride * es, cols * es, rows);
}

void add_into(const Tensor& dst, const Tensor& src) {
  check_pair("add_into", dst, src);
  check_dtype(dst, DType::F32, "add_into", "dst");
  DISTJAX_CHECK(dst.numel() == src.numel(), InvalidArgument, "[add_into] dst ",
                to_string(dst.shape()), " and src ", to_string(src.shape()),
                " hold different numbers of elements");
  DISTJAX_CHECK(!overlap(dst, src), InvalidArgument, "[add_into] dst and src overlap");
  Dispatch k("add_into", &KernelTable::inplace, {&src, &dst});
  k->add_f32(dst.data<float>(), src.data<float>(), dst.numel());
}

void scale_into(const Tensor& x, const Tensor& scale) {
  check_defined(x, "scale_into", "x");
  check_defined(scale, "scale_into", "scale");
  DISTJAX_CHECK(is_floating(x.dtype()), InvalidArgument,
                "[scale_into] scales f32, bf16 or f16, not ", dtype_name(x.dtype()));
  check_dtype(scale, DType::F32, "scale_into", "scale");
  DISTJAX_CHECK(scale.numel() == 1, InvalidArgument, "[scale_into] the scale is one value, got ",
                to_string(scale.shape()));
  Dispatch k("scale_into", &KernelTable::inplace, {&x, &scale});
  k->scale(x.raw_data(), x.dtype(), scale.data<float>(), x.numel());
}

void gemm_into(const Tensor& c, Block cb, const Tensor& a, Block ab, bool trans_a, const Tensor& b,
               Block bb, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               float beta) {
  for (const auto& [t, name] : {std::pair{&c, "c"}, std::pair{&a, "a"}, std::pair{&b, "b"}}) {
    check_defined(*t, "gemm_into", name);
    check_dtype(*t, DType::F32, "gemm_into", name);
  }
  check_runs("gemm_into", "c", c, {cb.offset, cb.ld}, m, n);
  check_runs("gemm_into", "a", a, {ab.offset, ab.ld}, trans_a ? k : m, trans_a ? m : k);
  check_runs("gemm_into", "b", b, {bb.offset, bb.ld}, trans_b ? n : k, trans_b ? k : n);
  if (m == 0 || n == 0) return;
  Dispatch kd("gemm_into", &KernelTable::gemm, {&a, &b, &c});
  kd->gemm_f32_strided(trans_a, trans_b, m, n, k, alpha, a.data<float>() + ab.offset, ab.ld, 0,
                       b.data<float>() + bb.offset, bb.ld, 0, beta, c.data<float>() + cb.offset,
                       cb.ld, 0, 1);
}

namespace {

void copy_box(const char* op, const Tensor& global, const std::vector<std::int64_t>& offset,
              const Tensor& local, bool to_local) {
  check_pair(op, global, local);
  const int rank = global.rank();
  DISTJAX_CHECK(local.rank() == rank && static_cast<int>(offset.size()) == rank, InvalidArgument,
                "[", op, "] a box ", to_string(local.shape()), " at ", offset.size(),
                " offsets in an array ", to_string(global.shape()));
  for (int d = 0; d < rank; ++d)
    DISTJAX_CHECK(offset[d] >= 0 && offset[d] + local.size(d) <= global.size(d), InvalidArgument,
                  "[", op, "] the box ", to_string(local.shape()), " at offset ", offset[d],
                  " of dimension ", d, " leaves the array ", to_string(global.shape()));
  const std::vector<std::int64_t> strides = contiguous_strides(global.shape());
  const detail::BoxPlan plan{rank, local.shape().data(), offset.data(), strides.data(),
                             dtype_size(global.dtype())};
  Dispatch k(op, &KernelTable::shard, {&global, &local});
  k->copy_box(global.raw_data(), local.raw_data(), plan, to_local);
}

}  // namespace

void copy_from_box(const Tensor& local, const Tensor& global,
                   const std::vector<std::int64_t>& offset) {
  copy_box("copy_from_box", global, offset, local, true);
}

void copy_to_box(const Tensor& global, const std::vector<std::int64_t>& offset,
                 const Tensor& local) {
  copy_box("copy_to_box", global, offset, local, false);
}

}  // namespace distjax::tensor
