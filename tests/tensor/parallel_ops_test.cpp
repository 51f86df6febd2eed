// The parallel layers' tensor functions on the CPU and on the checked device: vocabulary-
// parallel ids and one-hot labels with their out-of-range reports, pmax's owner masks and
// the f64 sum of squares (the same bits as a plain f64 loop in its fixed order).
#include "distjax/tensor/parallel_ops.hpp"
#include "distjax/tensor/update_ops.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace distjax::tensor {
namespace {

class ParallelOps : public ::testing::TestWithParam<Device> {
 protected:
  DeviceScope on_{GetParam()};
};

TEST_P(ParallelOps, ShardIdsKeepTheRowsOfThisDevice) {
  for (bool wide : {false, true}) {
    const Tensor ids = wide ? Tensor::from_vector<std::int64_t>({0, 4, 5, 7, 3, 9}, {2, 3})
                            : Tensor::from_vector<std::int32_t>({0, 4, 5, 7, 3, 9}, {2, 3});
    ShardIds s = shard_ids(ids, /*lo=*/3, /*rows=*/3, /*bound=*/10);
    EXPECT_EQ(s.local.shape(), (Shape{2, 3}));
    EXPECT_EQ(s.local.device(), GetParam());
    EXPECT_EQ(s.local.to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 1, 2, 0, 0, 0}));
    EXPECT_EQ(s.keep.to_vector<float>(), (std::vector<float>{0, 1, 1, 0, 1, 0}));
    EXPECT_EQ(s.out_of_range.count, 0);
    s = shard_ids(ids, 3, 3, /*bound=*/5);
    EXPECT_EQ(s.out_of_range.count, 3);
    EXPECT_EQ(s.out_of_range.first, 5);
    EXPECT_EQ(shard_ids(ids, 3, 3, /*bound=*/-1).out_of_range.count, 0);  // no bound
  }
}

TEST_P(ParallelOps, ShardOneHotMarksTheLabelsInThisDevicesColumns) {
  const Tensor labels = Tensor::from_vector<std::int32_t>({1, 2, 3, 0}, {2, 2});
  ShardOneHot h = shard_one_hot(labels, /*lo=*/1, /*width=*/2, /*bound=*/4);
  EXPECT_EQ(h.one_hot.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(h.one_hot.to_vector<float>(), (std::vector<float>{1, 0, 0, 1, 0, 0, 0, 0}));
  EXPECT_EQ(h.out_of_range.count, 0);
  h = shard_one_hot(Tensor::from_vector<std::int64_t>({-1, 2, 8}, {3}), 0, 4, 4);
  EXPECT_EQ(h.out_of_range.count, 2);
  EXPECT_EQ(h.out_of_range.first, -1);
}

TEST_P(ParallelOps, SelectEqualAgainstATensorOrOneValue) {
  const Tensor a = Tensor::from_vector<float>({1, 2, 3, 2}, {2, 2});
  const Tensor b = Tensor::from_vector<float>({1, 0, 3, 1}, {2, 2});
  EXPECT_EQ(select_equal(a, b, 5.f).to_vector<float>(), (std::vector<float>{5, 0, 5, 0}));
  EXPECT_EQ(select_equal(a, Tensor::scalar(2.0), 1.f).to_vector<float>(),
            (std::vector<float>{0, 1, 0, 1}));
  EXPECT_THROW(select_equal(a, Tensor::zeros({3}), 1.f), InvalidArgument);
}

// The order of the table's contract (table/parallel.hpp), written out: chunks of 8192, 8
// lanes each, the lanes' fixed tree, the chunks in order. Sizes below one chunk, across
// chunks with a short last one, and none.
TEST_P(ParallelOps, SumOfSquaresInItsFixedOrder) {
  for (std::size_t n : {std::size_t(1003), std::size_t(3 * 8192 + 11), std::size_t(0)}) {
    std::vector<float> v;
    for (std::size_t i = 0; i < n; ++i)
      v.push_back(0.001f * static_cast<float>(i % 37) - 0.011f * static_cast<float>(i % 5) +
                  (i % 4099 == 0 ? 3.f : 0.f));
    double want = 0.0;
    for (std::size_t c = 0; c < n; c += 8192) {
      double acc[8] = {};
      for (std::size_t j = c; j < std::min(n, c + 8192); ++j)
        acc[(j - c) % 8] += static_cast<double>(v[j]) * v[j];
      want += ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
    EXPECT_EQ(sum_of_squares_f64(Tensor::from_vector(v, {static_cast<std::int64_t>(n)})), want)
        << n;
  }
}

// Many leaves read back together: each sum the same bits as alone, in either family (the
// fixed order's and the optimizer's), for leaves of every size on this device and, mixed
// in, leaves on the host.
TEST_P(ParallelOps, SumsOfSquaresOfManyLeavesEqualEachAlone) {
  std::vector<Tensor> leaves;
  for (std::int64_t n : {std::int64_t(5), std::int64_t(0), std::int64_t(2 * 8192 + 3),
                         std::int64_t(1), std::int64_t(777)}) {
    std::vector<float> v;
    for (std::int64_t i = 0; i < n; ++i) v.push_back(0.01f * static_cast<float>((i * 7 + n) % 101) - 0.5f);
    leaves.push_back(Tensor::from_vector(v, {n}, GetParam()));
    leaves.push_back(Tensor::from_vector(v, {n}, Device::cpu()));
  }
  const std::vector<double> f64 = sums_of_squares_f64(leaves), plain = sums_of_squares(leaves);
  ASSERT_EQ(f64.size(), leaves.size());
  ASSERT_EQ(plain.size(), leaves.size());
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    EXPECT_EQ(f64[i], sum_of_squares_f64(leaves[i])) << "leaf " << i;
    EXPECT_EQ(plain[i], sum_of_squares(leaves[i])) << "leaf " << i;
  }
  EXPECT_TRUE(sums_of_squares_f64({}).empty());
  EXPECT_THROW(sums_of_squares_f64({Tensor::zeros({3}, DType::I32)}), InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Devices, ParallelOps,
                         ::testing::Values(Device::cpu(), Device{DeviceKind::Checked, 0}),
                         [](const auto& info) {
                           return std::string(device_kind_name(info.param.kind));
                         });

}  // namespace
}  // namespace distjax::tensor
