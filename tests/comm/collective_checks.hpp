// The shared check of every collective's values against the host, used by the threads
// tests and the MPI tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "comm/comm_test_util.hpp"
#include "distjax/comm/communicator.hpp"

namespace distjax::comm::testing {

// Checks every collective on `c`, whose members are global device ids `c.group()`;
// inputs are keyed by global id so sub-groups can be checked against the host too.
inline void check_all_collectives(Communicator& c, std::int64_t count, bool exact = true) {
  // Exact: the threads backend sums in rank order; MPI may use another order.
  auto same = [exact](float got, float want) {
    // Inputs reach +-1e3 and cancel, so the absolute error of another order is ~1e-4.
    return exact ? got == want : std::abs(got - want) <= 1e-3f + 1e-5f * std::abs(want);
  };
  const int n = c.size(), r = c.rank();
  const auto& g = c.group();
  const int me = c.global_rank();
  ASSERT_EQ(g[r], me);
  // all_reduce: sum (bitwise equal to the host's rank-order sum), mean, max; in place too.
  {
    auto x = inputs_f32(me, count);
    std::vector<float> y(count, -1.f);
    c.all_reduce(x.data(), y.data(), count, DType::F32, ReduceOp::Sum);
    auto want = host_sum_f32(g, count);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(y[i], want[i])) << "sum i=" << i << ": " << y[i] << " vs " << want[i];
    c.all_reduce(x.data(), x.data(), count, DType::F32, ReduceOp::Sum);  // in place
    for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(x[i], want[i])) << "in-place i=" << i;
    x = inputs_f32(me, count);
    c.all_reduce(x.data(), y.data(), count, DType::F32, ReduceOp::Mean);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(y[i], want[i] / n)) << "mean i=" << i;
    c.all_reduce(x.data(), y.data(), count, DType::F32, ReduceOp::Max);
    for (std::int64_t i = 0; i < count; ++i) {
      float m = input_f32(g[0], i);
      for (int j : g) m = std::max(m, input_f32(j, i));
      ASSERT_EQ(y[i], m) << "max i=" << i;
    }
    auto xi = inputs_i32(me, count);
    std::vector<std::int32_t> yi(count);
    c.all_reduce(xi.data(), yi.data(), count, DType::I32, ReduceOp::Sum);
    for (std::int64_t i = 0; i < count; ++i) {
      std::int32_t s = 0;
      for (int j : g) s += input_i32(j, i);
      ASSERT_EQ(yi[i], s);
    }
  }
  // all_gather, f32 and i32: rank-major blocks.
  {
    auto x = inputs_f32(me, count);
    std::vector<float> y(n * count);
    c.all_gather(x.data(), y.data(), count, DType::F32);
    for (int j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < count; ++i) ASSERT_EQ(y[j * count + i], input_f32(g[j], i));
    auto xi = inputs_i32(me, count);
    std::vector<std::int32_t> yi(n * count);
    c.all_gather(xi.data(), yi.data(), count, DType::I32);
    for (int j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < count; ++i) ASSERT_EQ(yi[j * count + i], input_i32(g[j], i));
  }
  // reduce_scatter: block r of the rank-order sum of everyone's (n*count) input.
  {
    auto x = inputs_f32(me, n * count);
    std::vector<float> y(count);
    c.reduce_scatter(x.data(), y.data(), count, DType::F32, ReduceOp::Sum);
    auto want = host_sum_f32(g, count, r * count);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(y[i], want[i])) << "rs i=" << i;
    c.reduce_scatter(x.data(), y.data(), count, DType::F32, ReduceOp::Mean);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(y[i], want[i] / n));
  }
  // all_to_all, f32 and i32: block j of my recv is block r of rank j's send.
  {
    auto x = inputs_f32(me, n * count);
    std::vector<float> y(n * count);
    c.all_to_all(x.data(), y.data(), count, DType::F32);
    for (int j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < count; ++i)
        ASSERT_EQ(y[j * count + i], input_f32(g[j], r * count + i));
    auto xi = inputs_i32(me, n * count);
    std::vector<std::int32_t> yi(n * count);
    c.all_to_all(xi.data(), yi.data(), count, DType::I32);
    for (int j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < count; ++i)
        ASSERT_EQ(yi[j * count + i], input_i32(g[j], r * count + i));
  }
  // broadcast from every root.
  for (int root = 0; root < n; ++root) {
    auto x = inputs_f32(me, count);
    c.broadcast(x.data(), count, DType::F32, root);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_EQ(x[i], input_f32(g[root], i));
  }
  // permute: a shift-by-one ring, and a partial permutation (receivers of nothing get 0).
  {
    std::vector<std::pair<int, int>> ring, partial;
    for (int j = 0; j < n; ++j) ring.push_back({j, (j + 1) % n});
    partial.push_back({n - 1, 0});
    auto x = inputs_f32(me, count);
    std::vector<float> y(count, -1.f);
    c.permute(x.data(), y.data(), count, DType::F32, ring);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_EQ(y[i], input_f32(g[(r + n - 1) % n], i));
    c.permute(x.data(), y.data(), count, DType::F32, partial);
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_EQ(y[i], r == 0 ? input_f32(g[n - 1], i) : 0.f);
  }
  c.barrier();
}

}  // namespace distjax::comm::testing
