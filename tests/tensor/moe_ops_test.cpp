// The Mixture-of-Experts ops: top-k against a sort, the dispatch plan's order, capacity and
// priority against references written here, dispatch then combine as the identity (bit for
// bit, values and gradients), the grouped product against one matmul per group (f32 and
// bf16, an empty group included), gradients against finite differences, and bad input
// refused. Also run on the checked device (ctest's checked_moe_ops).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/moe.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "grad_check.hpp"

namespace distjax::tensor {
namespace {

using testing::check_gradients;
using testing::GradCase;
using testing::one;

// Random experts (N, k) i32 in [0, e): with distinct experts per token when `distinct`.
Tensor random_experts(std::int64_t n, std::int64_t k, std::int64_t e, std::uint32_t seed,
                      bool distinct = true) {
  std::mt19937 gen(seed);
  std::vector<std::int32_t> out;
  std::vector<std::int32_t> all(static_cast<std::size_t>(e));
  std::iota(all.begin(), all.end(), 0);
  for (std::int64_t t = 0; t < n; ++t) {
    std::shuffle(all.begin(), all.end(), gen);
    for (std::int64_t s = 0; s < k; ++s)
      out.push_back(distinct ? all[static_cast<std::size_t>(s)]
                             : std::int32_t(gen() % static_cast<std::uint32_t>(e)));
  }
  return Tensor::from_vector(out, {n, k});
}

TEST(MoeOps, TopKIsTheStableSortsFirstColumns) {
  // Values from a small set: many ties, which go to the lower column.
  const std::int64_t n = 37, e = 11;
  std::mt19937 gen(5);
  std::vector<float> v(static_cast<std::size_t>(n * e));
  for (float& x : v) x = float(gen() % 5) - 2.f;
  const Tensor scores = Tensor::from_vector(v, {n, e});
  for (std::int64_t k : {1, 2, 3, 8}) {
    const std::vector<std::int32_t> got = top_k_indices(scores, k).to_vector<std::int32_t>();
    for (std::int64_t i = 0; i < n; ++i) {
      std::vector<std::int32_t> cols(static_cast<std::size_t>(e));
      std::iota(cols.begin(), cols.end(), 0);
      std::stable_sort(cols.begin(), cols.end(), [&](std::int32_t a, std::int32_t b) {
        return v[static_cast<std::size_t>(i * e + a)] > v[static_cast<std::size_t>(i * e + b)];
      });
      for (std::int64_t j = 0; j < k; ++j)
        ASSERT_EQ(got[static_cast<std::size_t>(i * k + j)], cols[static_cast<std::size_t>(j)])
            << "k " << k << " row " << i << " slot " << j;
    }
  }
  EXPECT_THROW(top_k_indices(scores, 0), InvalidArgument);
  EXPECT_THROW(top_k_indices(scores, 12), InvalidArgument);
  EXPECT_THROW(top_k_indices(Tensor::zeros({4, 16}), 9), InvalidArgument);
}

// The plan's rows: expert by expert, each expert's kept pairs in token order, every row
// taken once; `kept(i)` says which pairs the test expects kept.
template <class Kept>
void expect_plan(const DispatchPlan& plan, const std::vector<std::int32_t>& experts,
                 std::int64_t e, Kept kept) {
  const std::vector<std::int32_t> pos = plan.position.to_vector<std::int32_t>();
  std::int32_t row = 0;
  for (std::int32_t g = 0; g < e; ++g) {
    std::int64_t count = 0;
    for (std::size_t i = 0; i < experts.size(); ++i) {
      if (experts[i] != g) continue;
      if (kept(i)) {
        ASSERT_EQ(pos[i], row++) << "pair " << i << " of expert " << g;
        ++count;
      } else {
        ASSERT_EQ(pos[i], -1) << "pair " << i << " of expert " << g << " should be dropped";
      }
    }
    ASSERT_EQ(plan.counts[static_cast<std::size_t>(g)], count) << "expert " << g;
  }
  EXPECT_EQ(plan.rows(), row);
}

TEST(MoeOps, DroplessPlanOrdersThePairsByExpertThenToken) {
  const std::int64_t n = 50, k = 3, e = 7;
  const Tensor experts = random_experts(n, k, e, 1, /*distinct=*/false);
  const DispatchPlan plan = dispatch_plan(experts, e);
  expect_plan(plan, experts.to_vector<std::int32_t>(), e, [](std::size_t) { return true; });
  EXPECT_EQ(plan.dropped(), 0);
  EXPECT_EQ(plan.routed, plan.counts);
  EXPECT_EQ(plan.offsets().back(), n * k);
}

TEST(MoeOps, CapacityKeepsTheFirstPairsOrTheHighestPriority) {
  const std::int64_t n = 64, k = 2, e = 4, capacity = 20;
  const Tensor experts = random_experts(n, k, e, 2);
  const std::vector<std::int32_t> ex = experts.to_vector<std::int32_t>();
  // By position: an expert's first `capacity` pairs in token order.
  {
    const DispatchPlan plan = dispatch_plan(experts, e, capacity);
    std::vector<std::int64_t> seen(e, 0);
    std::vector<bool> keep(ex.size());
    for (std::size_t i = 0; i < ex.size(); ++i) keep[i] = seen[ex[i]]++ < capacity;
    expect_plan(plan, ex, e, [&](std::size_t i) { return bool(keep[i]); });
    for (std::int64_t c : plan.counts) EXPECT_LE(c, capacity);
    EXPECT_GT(plan.dropped(), 0) << "the test should drop something";
  }
  // By priority, with ties (equal priorities keep the earlier pair).
  {
    std::mt19937 gen(3);
    std::vector<float> pr(ex.size());
    for (float& p : pr) p = float(gen() % 6);
    const DispatchPlan plan =
        dispatch_plan(experts, e, capacity, Tensor::from_vector(pr, {n, k}));
    std::vector<bool> keep(ex.size());
    for (std::size_t i = 0; i < ex.size(); ++i) {
      std::int64_t above = 0;
      for (std::size_t j = 0; j < ex.size(); ++j)
        above += ex[j] == ex[i] && (pr[j] > pr[i] || (pr[j] == pr[i] && j < i));
      keep[i] = above < capacity;
    }
    expect_plan(plan, ex, e, [&](std::size_t i) { return bool(keep[i]); });
  }
  // Capacity 0 drops everything.
  const DispatchPlan none = dispatch_plan(experts, e, 0);
  EXPECT_EQ(none.rows(), 0);
  EXPECT_EQ(none.dropped(), n * k);
}

TEST(MoeOps, DispatchThenCombineIsTheIdentityBitForBit) {
  const std::int64_t n = 33, d = 24, e = 8;
  const Tensor x0 = testing::uniform({n, d}, 7, -3.f, 3.f);
  const Tensor cot = testing::uniform({n, d}, 8);
  for (std::int64_t k : {1, 2, 4}) {
    const DispatchPlan plan = dispatch_plan(random_experts(n, k, e, 9 + k), e);
    const Tensor gates = Tensor::full({n, k}, 1.0 / double(k));
    TensorTree p;
    p.set("x", x0.clone());
    auto [loss, grads] = autodiff::value_and_grad([&](const TensorTree& t) {
      const Tensor y = moe_combine(moe_dispatch(t.at("x"), plan), plan, gates);
      EXPECT_EQ(y.to_vector<float>(), x0.to_vector<float>()) << "k " << k;
      return sum(mul(y, cot));
    })(p);
    EXPECT_EQ(grads.at("x").to_vector<float>(), cot.to_vector<float>()) << "k " << k;
  }
}

TEST(MoeOps, CombineSumsTheGatedRowsOfItsSlots) {
  const std::int64_t n = 20, k = 2, d = 5, e = 3;
  const Tensor experts = random_experts(n, k, e, 4);
  const DispatchPlan plan = dispatch_plan(experts, e, /*capacity=*/6);
  const Tensor y = testing::uniform({plan.rows(), d}, 5);
  const Tensor gates = testing::uniform({n, k}, 6, 0.f, 1.f);
  const std::vector<std::int32_t> pos = plan.position.to_vector<std::int32_t>();
  const std::vector<float> yv = y.to_vector<float>(), gv = gates.to_vector<float>();
  std::vector<double> want(static_cast<std::size_t>(n * d), 0.0);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t s = 0; s < k; ++s) {
      const std::int32_t p = pos[static_cast<std::size_t>(t * k + s)];
      if (p < 0) continue;
      for (std::int64_t c = 0; c < d; ++c)
        want[static_cast<std::size_t>(t * d + c)] +=
            double(gv[static_cast<std::size_t>(t * k + s)]) * yv[static_cast<std::size_t>(p * d + c)];
    }
  testing::expect_close(moe_combine(y, plan, gates), want, 1e-6, "combine");
}

// The grouped product against a matmul per group, over random group sizes with an empty
// group, f32 and bf16 operands, both layouts of w: values and both gradients. Small, run
// group after group; and large enough that the groups' products are cut in blocks of
// columns spread over the threads (300 columns: two blocks per group).
class GroupedMatmul : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(GroupedMatmul, EqualsAMatmulPerGroup) {
  const std::int64_t kdim = 12, ndim = GetParam();
  const std::vector<std::int64_t> offsets =
      ndim < 100 ? std::vector<std::int64_t>{0, 5, 5, 17, 18, 30}
                 : std::vector<std::int64_t>{0, 40, 40, 100, 101, 160};
  const std::int64_t groups = std::int64_t(offsets.size()) - 1, m = offsets.back();
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (bool trans_w : {false, true}) {
      const Tensor x0 = testing::uniform({m, kdim}, 11);
      const Tensor w0 = trans_w ? testing::uniform({groups, ndim, kdim}, 12)
                                : testing::uniform({groups, kdim, ndim}, 12);
      const Tensor cot = testing::uniform({m, ndim}, 13);
      auto run = [&](bool grouped) {
        TensorTree p;
        p.set("x", x0.clone());
        p.set("w", w0.clone());
        Tensor out;
        auto [loss, grads] = autodiff::value_and_grad([&](const TensorTree& t) {
          const Tensor x = astype(t.at("x"), dtype), w = astype(t.at("w"), dtype);
          if (grouped) {
            out = grouped_matmul(x, w, offsets, trans_w);
          } else {
            std::vector<Tensor> parts;
            for (std::int64_t g = 0; g < groups; ++g) {
              const Tensor wg = reshape(slice(w, 0, g, g + 1), {w.size(1), w.size(2)});
              parts.push_back(matmul(slice(x, 0, offsets[g], offsets[g + 1]), wg, false, trans_w));
            }
            out = concat(parts, 0);
          }
          return sum(mul(out, cot));
        })(p);
        return std::vector<Tensor>{out, grads.at("x"), grads.at("w")};
      };
      const std::vector<Tensor> got = run(true), want = run(false);
      // dx sums ndim products: 300 of them in other orders than the matmul's differ by a few
      // f32 ulps more than 10 do.
      const double tol = dtype == DType::F32 ? (ndim < 100 ? 1e-6 : 1e-5) : 1e-2;
      const char* names[] = {"out", "dx", "dw"};
      for (std::size_t i = 0; i < 3; ++i) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (trans_w ? " trans_w " : " ") + names[i]);
        testing::expect_close(got[i], want[i], tol, names[i]);
      }
      // The empty group's weight gradient is zero.
      const std::vector<float> dw = got[2].to_vector<float>();
      for (std::int64_t i = 0; i < kdim * ndim; ++i)
        ASSERT_EQ(dw[static_cast<std::size_t>(kdim * ndim + i)], 0.f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MoeOps, GroupedMatmul, ::testing::Values(10, 300),
                         [](const auto& info) { return "columns" + std::to_string(info.param); });

std::vector<GradCase> grad_cases() {
  const std::int64_t n = 6, k = 2, e = 4, d = 3;
  const Tensor experts = random_experts(n, k, e, 21);
  // Columns repeated within a row: their cotangents add up.
  const Tensor repeated = Tensor::from_vector(std::vector<std::int32_t>{0, 0, 1, 3, 2, 2, 3, 1, 0, 1, 2, 2}, {n, k});
  const DispatchPlan plan = dispatch_plan(experts, e);
  const DispatchPlan capped = dispatch_plan(experts, e, /*capacity=*/2);
  const std::vector<std::int64_t> offsets{0, 2, 2, 7};
  return {
      {"take_along_last", {testing::uniform({n, e}, 22)},
       one([experts](const std::vector<Tensor>& x) { return take_along_last(x[0], experts); })},
      {"take_along_last_repeated", {testing::uniform({n, e}, 30)},
       one([repeated](const std::vector<Tensor>& x) { return take_along_last(x[0], repeated); })},
      {"moe_dispatch", {testing::uniform({n, d}, 23)},
       one([plan](const std::vector<Tensor>& x) { return moe_dispatch(x[0], plan); })},
      {"moe_combine", {testing::uniform({capped.rows(), d}, 24), testing::uniform({n, k}, 25)},
       one([capped](const std::vector<Tensor>& x) { return moe_combine(x[0], capped, x[1]); })},
      {"grouped_matmul", {testing::uniform({7, 3}, 26), testing::uniform({3, 3, 4}, 27)},
       one([offsets](const std::vector<Tensor>& x) { return grouped_matmul(x[0], x[1], offsets); })},
      {"grouped_matmul_trans_w", {testing::uniform({7, 3}, 28), testing::uniform({3, 4, 3}, 29)},
       one([offsets](const std::vector<Tensor>& x) {
         return grouped_matmul(x[0], x[1], offsets, true);
       })},
  };
}

TEST(MoeOps, GradientsMatchFiniteDifferences) {
  for (const GradCase& c : grad_cases()) EXPECT_TRUE(check_gradients(c)) << c.name;
}

TEST(MoeOps, BadInputIsRefusedNamingIt) {
  const Tensor experts = Tensor::from_vector(std::vector<std::int32_t>{0, 1, 2, 5}, {2, 2});
  try {
    dispatch_plan(experts, 4);
    FAIL() << "expert 5 of 4 was accepted";
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("names expert 5 of 4"), std::string::npos) << err.what();
  }
  EXPECT_THROW(dispatch_plan(Tensor::zeros({2, 2}), 4), InvalidArgument);  // f32 experts
  const Tensor x = Tensor::zeros({4, 3}), w = Tensor::zeros({2, 3, 5});
  EXPECT_THROW(grouped_matmul(x, w, {0, 2, 3}), InvalidArgument);      // ends before the rows
  EXPECT_THROW(grouped_matmul(x, w, {0, 3, 2, 4}), InvalidArgument);   // too many
  EXPECT_THROW(grouped_matmul(x, Tensor::zeros({2, 4, 5}), {0, 2, 4}), InvalidArgument);
  EXPECT_THROW(grouped_matmul(x, astype(w, DType::BF16), {0, 2, 4}), InvalidArgument);
  const DispatchPlan plan = dispatch_plan(Tensor::zeros({4, 1}, DType::I32), 2);
  EXPECT_THROW(moe_dispatch(Tensor::zeros({5, 3}), plan), InvalidArgument);
  EXPECT_THROW(moe_combine(Tensor::zeros({3, 3}), plan), InvalidArgument);
}

}  // namespace
}  // namespace distjax::tensor
