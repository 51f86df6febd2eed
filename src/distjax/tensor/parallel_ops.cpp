#include "distjax/tensor/parallel_ops.hpp"

#include "distjax/core/error.hpp"
#include "distjax/tensor/detail/sums_by_device.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {

using detail::Dispatch;
using detail::KernelTable;

namespace {

void check_ids(const char* op, const Tensor& ids) {
  check_defined(ids, op, "ids");
  DISTJAX_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64, InvalidArgument, "[", op,
                "] expects i32 or i64 ids, got ", dtype_name(ids.dtype()));
}

OutOfRange out_of_range(const detail::IdReport& r) {
  return {r.bad, r.first};
}

}  // namespace

ShardIds shard_ids(const Tensor& ids, std::int64_t lo, std::int64_t rows, std::int64_t bound) {
  check_ids("shard_ids", ids);
  const Device device = ids.device();
  ShardIds out{Tensor::empty(ids.shape(), DType::I64, device),
               Tensor::empty(ids.shape(), DType::F32, device),
               {}};
  detail::IdReport report;
  Dispatch k("shard_ids", &KernelTable::shard, {&ids, &out.local, &out.keep});
  k->shard_ids(ids.raw_data(), ids.dtype(), ids.numel(), lo, rows, bound,
               out.local.data<std::int64_t>(), out.keep.data<float>(), &report);
  out.out_of_range = out_of_range(report);
  return out;
}

ShardOneHot shard_one_hot(const Tensor& labels, std::int64_t lo, std::int64_t width,
                          std::int64_t bound) {
  check_ids("shard_one_hot", labels);
  Shape shape = labels.shape();
  shape.push_back(width);
  ShardOneHot out{Tensor::zeros(shape, DType::F32, labels.device()), {}};
  detail::IdReport report;
  Dispatch k("shard_one_hot", &KernelTable::shard, {&labels, &out.one_hot});
  k->shard_one_hot(labels.raw_data(), labels.dtype(), labels.numel(), lo, width, bound,
                   out.one_hot.data<float>(), &report);
  out.out_of_range = out_of_range(report);
  return out;
}

Tensor select_equal(const Tensor& a, const Tensor& b, float value) {
  check_defined(a, "select_equal", "a");
  check_defined(b, "select_equal", "b");
  check_dtype(a, DType::F32, "select_equal", "a");
  check_dtype(b, DType::F32, "select_equal", "b");
  const bool scalar = b.numel() == 1 && a.shape() != b.shape();
  DISTJAX_CHECK(scalar || a.shape() == b.shape(), InvalidArgument, "[select_equal] a ",
                to_string(a.shape()), " and b ", to_string(b.shape()),
                ": b needs a's shape or one element");
  Tensor out = Tensor::empty(a.shape(), DType::F32, detail::op_device("select_equal", {&a, &b}));
  Dispatch k("select_equal", &KernelTable::shard, {&a, &b, &out});
  k->select_equal(a.data<float>(), b.data<float>(), scalar, value, out.data<float>(), a.numel());
  return out;
}

std::vector<double> sums_of_squares_f64(const std::vector<Tensor>& xs) {
  for (const Tensor& x : xs) {
    check_defined(x, "sums_of_squares_f64", "x");
    check_dtype(x, DType::F32, "sums_of_squares_f64", "x");
  }
  return detail::sums_by_device("sums_of_squares_f64", xs, &KernelTable::shard,
                                &detail::ShardKernels::sum_squares_f64_many);
}

double sum_of_squares_f64(const Tensor& x) {
  check_defined(x, "sum_of_squares_f64", "x");
  check_dtype(x, DType::F32, "sum_of_squares_f64", "x");
  double out = 0;
  detail::count_host_wait(x.device());
  Dispatch k("sum_of_squares_f64", &KernelTable::shard, {&x});
  k->sum_squares_f64(x.data<float>(), x.numel(), &out);
  return out;
}

}  // namespace distjax::tensor
