// Reductions and broadcasting binary ops at sizes that take the parallel and fast paths,
// against plain loops; the broadcasting plan for every operand layout; argmax, and the
// shape ops on every element width.
#include <gtest/gtest.h>

#include <vector>

#include "distjax/distjax.hpp"
#include "distjax/tensor/cpu/grain.hpp"
#include "distjax/tensor/detail/kernels.hpp"
#include "grad_check.hpp"

namespace distjax::tensor {
namespace {

using testing::uniform;
using K = detail::BroadcastPlan::Kind;

TEST(BroadcastPlan, ClassifiesOperandLayouts) {
  EXPECT_EQ(detail::plan_broadcast({2, 3}, {2, 3}).kind, K::Same);
  EXPECT_EQ(detail::plan_broadcast({}, {2, 3}).kind, K::Scalar);
  EXPECT_EQ(detail::plan_broadcast({1, 1}, {2, 3}).kind, K::Scalar);
  auto row = detail::plan_broadcast({1, 3, 4}, {2, 3, 4});
  EXPECT_EQ(row.kind, K::Row);
  EXPECT_EQ(row.outer, 2);
  EXPECT_EQ(row.inner, 12);
  auto col = detail::plan_broadcast({2, 3, 1}, {2, 3, 4});
  EXPECT_EQ(col.kind, K::Col);
  EXPECT_EQ(col.outer, 6);
  EXPECT_EQ(col.inner, 4);
  EXPECT_EQ(detail::plan_broadcast({2, 1, 4}, {2, 3, 4}).kind, K::General);
  EXPECT_EQ(detail::plan_broadcast({3, 1}, {2, 3, 4}).kind, K::General);
  EXPECT_EQ(detail::plan_broadcast({1, 3, 1}, {2, 3, 4}).kind, K::General);
}

// a op b for every pair of layouts, against explicit index arithmetic.
TEST(Broadcast, BinaryOpsMatchIndexArithmeticForEveryLayout) {
  // Small enough to run serially; the kernels pick their fast paths by layout, not size.
  const Shape out{3, 40, 300};
  const std::vector<Shape> layouts{{3, 40, 300}, {},          {300},   {40, 300}, {3, 40, 1},
                                   {3, 1, 1},    {3, 1, 300}, {40, 1}, {1, 40, 1}};
  int seed = 0;
  for (const Shape& sa : layouts)
    for (const Shape& sb : layouts) {
      Tensor a = uniform(sa, ++seed), b = uniform(sb, ++seed, 0.5f, 1.5f);
      Tensor y = sub(div(a, b), mul(b, a));
      if (broadcast_shapes(sa, sb, "test") != out) continue;
      const auto pa = a.to_vector<float>(), pb = b.to_vector<float>(), py = y.to_vector<float>();
      for (std::int64_t i = 0; i < numel(out); ++i) {
        const float va = pa[detail::broadcast_index(sa, out, i)],
                    vb = pb[detail::broadcast_index(sb, out, i)];
        ASSERT_FLOAT_EQ(py[i], va / vb - vb * va)
            << to_string(sa) << " with " << to_string(sb) << " at " << i;
      }
    }
}

// Above kParallelGrainMemory: the parallel versions of each fast path (every 7th element checked).
TEST(Broadcast, LargeOperandsTakeTheParallelPaths) {
  const Shape out{5, 48, 4400};
  ASSERT_GT(numel(out), detail::kParallelGrainMemory);
  const std::vector<std::pair<Shape, Shape>> pairs{
      {out, out}, {out, {4400}}, {{4400}, out},       {out, {5, 48, 1}},      {{5, 48, 1}, out},
      {out, {}},  {{}, out},     {out, {5, 1, 4400}}, {{48, 1}, {5, 1, 4400}}};
  int seed = 700;
  for (const auto& [sa, sb] : pairs) {
    Tensor a = uniform(sa, ++seed), b = uniform(sb, ++seed, 0.5f, 1.5f);
    Tensor y = sub(div(a, b), mul(b, a));
    Tensor ya = broadcast_to(a, out);
    ASSERT_EQ(y.shape(), out);
    const auto pa = a.to_vector<float>(), pb = b.to_vector<float>(), py = y.to_vector<float>(),
               pya = ya.to_vector<float>();
    for (std::int64_t i = 0; i < numel(out); i += 7) {
      const float va = pa[detail::broadcast_index(sa, out, i)],
                  vb = pb[detail::broadcast_index(sb, out, i)];
      ASSERT_FLOAT_EQ(py[i], va / vb - vb * va)
          << to_string(sa) << " with " << to_string(sb) << " at " << i;
      ASSERT_EQ(pya[i], va) << to_string(sa) << " at " << i;
    }
  }
}

TEST(Broadcast, BroadcastToAndWhereMatchIndexArithmetic) {
  const Shape out{3, 40, 300};
  const std::vector<Shape> layouts{{3, 40, 300}, {},        {1},         {300},   {40, 300},
                                   {3, 40, 1},   {3, 1, 1}, {3, 1, 300}, {40, 1}, {1, 40, 1}};
  int seed = 500;
  Tensor cond = uniform({40, 1}, 499);
  for (const Shape& sa : layouts) {
    Tensor a = uniform(sa, ++seed);
    Tensor y = broadcast_to(a, out);
    Tensor w = where(cond, a, Tensor::zeros(out));  // uniform cond is never exactly 0: picks a
    const auto pa = a.to_vector<float>(), py = y.to_vector<float>(), pw = w.to_vector<float>();
    for (std::int64_t i = 0; i < numel(out); ++i) {
      ASSERT_EQ(py[i], pa[detail::broadcast_index(sa, out, i)]) << to_string(sa) << " at " << i;
      ASSERT_EQ(pw[i], pa[detail::broadcast_index(sa, out, i)]) << to_string(sa) << " at " << i;
    }
  }
}

TEST(Broadcast, EmptyOperands) {
  Tensor a = Tensor::zeros({1, 0}), b = Tensor::zeros({3, 0});
  EXPECT_EQ(add(a, b).shape(), (Shape{3, 0}));
  EXPECT_EQ(broadcast_to(a, {2, 3, 0}).shape(), (Shape{2, 3, 0}));
  EXPECT_EQ(sum(b, {0}).shape(), (Shape{0}));
  EXPECT_EQ(sum(b, {1}).to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

TEST(BroadcastIndex, MapsOutputCoordinates) {
  // operand (3, 1) in output (2, 3, 4): element (i, j, k) reads operand (j, 0).
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        EXPECT_EQ(detail::broadcast_index({3, 1}, {2, 3, 4}, (i * 3 + j) * 4 + k), j);
}

// Sum and max over every subset of axes of a tensor above kParallelGrainMemory (each of
// the serial, parallel-over-rows and per-thread-partials paths) against plain loops.
TEST(Reduce, SumAndMaxOverAxisSubsetsMatchLoops) {
  const Shape s{33, 65, 513};
  ASSERT_GT(numel(s), detail::kParallelGrainMemory);
  Tensor x = uniform(s, 99, -1.f, 1.f);
  const std::vector<float> px = x.to_vector<float>();
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<int> axes;
    for (int d = 0; d < 3; ++d)
      if (mask & (1 << d)) axes.push_back(d);
    Tensor sm = sum(x, axes, true), mx = max(x, axes, true);
    std::vector<double> ws(sm.numel(), 0.0);
    std::vector<float> wm(mx.numel(), -INFINITY);
    for (std::int64_t i = 0; i < s[0]; ++i)
      for (std::int64_t j = 0; j < s[1]; ++j)
        for (std::int64_t k = 0; k < s[2]; ++k) {
          const std::int64_t oi = (mask & 1) ? 0 : i, oj = (mask & 2) ? 0 : j,
                             ok = (mask & 4) ? 0 : k;
          const std::int64_t o = (oi * sm.size(1) + oj) * sm.size(2) + ok;
          const float v = px[(i * s[1] + j) * s[2] + k];
          ws[o] += v;
          wm[o] = std::max(wm[o], v);
        }
    const std::vector<float> got_sum = sm.to_vector<float>(), got_max = mx.to_vector<float>();
    for (std::int64_t o = 0; o < sm.numel(); ++o) {
      ASSERT_NEAR(got_sum[o], ws[o], 1e-5 * (1 + std::abs(ws[o])) * 40) << "mask " << mask;
      ASSERT_EQ(got_max[o], wm[o]) << "mask " << mask;
    }
  }
}

TEST(Reduce, BiasGradientSumToRowsAndLongVectors) {
  // (N, C) -> (C): the bias gradient; split over rows into per-thread partials.
  const std::int64_t c = 256, n = detail::kParallelGrainMemory / c + 5;
  Tensor g = uniform({n, c}, 100);
  const std::vector<float> b = sum_to(g, {c}).to_vector<float>(), pg = g.to_vector<float>();
  std::vector<double> want(c, 0.0);
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t j = 0; j < c; ++j)
      want[j] += pg[r * c + j];
  for (std::int64_t j = 0; j < c; ++j)
    ASSERT_NEAR(b[j], want[j], 2e-3);
  // A long 1-D vector and its mean.
  Tensor v = Tensor::full({std::int64_t(1) << 21}, 0.5);
  EXPECT_FLOAT_EQ(sum(v).item<float>(), 1048576.f);
  EXPECT_FLOAT_EQ(mean(v).item<float>(), 0.5f);
  // max over the leading axis with the maximum in the last row.
  const std::int64_t rows = detail::kParallelGrainMemory / 50 + 3;
  std::vector<float> pm = uniform({rows, 50}, 101).to_vector<float>();
  for (std::int64_t j = 0; j < 50; ++j)
    pm[(rows - 1) * 50 + j] = 2.f + j;
  auto mv = max(Tensor::from_vector(pm, {rows, 50}), {0}).to_vector<float>();
  for (std::int64_t j = 0; j < 50; ++j)
    EXPECT_EQ(mv[j], 2.f + j);
}

}  // namespace
}  // namespace distjax::tensor

namespace distjax::tensor {
namespace {

TEST(Reduce, ArgmaxPicksTheFirstMaximumAlongAnyAxis) {
  // (2, 3, 2) with ties: the first maximal index wins.
  Tensor x = Tensor::from_vector<float>({1, 5, 3, 5, 3, 0, 7, 7, 7, 2, -1, 9}, {2, 3, 2});
  EXPECT_EQ(argmax(x, 0).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 1, 1, 0, 0, 1}));
  EXPECT_EQ(argmax(x, 1).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 0, 0, 2}));
  EXPECT_EQ(argmax(x, -1).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 1, 0, 0, 0, 1}));
}

// Permutes, slices and concatenations move bytes of any dtype (2, 4 and 8 bytes wide).
TEST(ShapeOps, MoveElementsOfEveryWidth) {
  Tensor x = Tensor::from_vector<std::int64_t>({0, 1, 2, 3, 4, 5}, {2, 3});
  EXPECT_EQ(transpose(x).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(slice(x, 1, 1, 3).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 2, 4, 5}));
  EXPECT_EQ(concat({x, x}, 1).to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5}));
  Tensor h = astype(x, DType::BF16);
  EXPECT_EQ(astype(transpose(h), DType::I64).to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{0, 3, 1, 4, 2, 5}));
  Tensor i = astype(x, DType::I32);
  EXPECT_EQ(permute(reshape(i, {1, 2, 3}), {2, 0, 1}).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{0, 3, 1, 4, 2, 5}));
}

TEST(Reduce, MaxGradientGoesToTheFirstMaximum) {
  for (const std::vector<int>& axes : {std::vector<int>{1}, std::vector<int>{0, 1}}) {
    Tensor x = make_leaf(Tensor::from_vector<float>({1, 3, 3, 5, 5, 0}, {2, 3}));
    Tensor y = max(x, axes);
    Tensor g = autodiff::grad({sum(y)}, {Tensor()}, {x})[0];
    if (axes.size() == 1)
      EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{0, 1, 0, 1, 0, 0}));
    else
      EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{0, 0, 0, 1, 0, 0}));
  }
  // Non-adjacent axes take the general path.
  Tensor x = make_leaf(Tensor::from_vector<float>({2, 2, 1, 2, 0, 2, 2, 2}, {2, 2, 2}));
  Tensor g = autodiff::grad({sum(max(x, {0, 2}))}, {Tensor()}, {x})[0];
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{1, 0, 0, 1, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace distjax::tensor
