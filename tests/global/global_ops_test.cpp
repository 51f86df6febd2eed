// The propagation rules of matmul, elementwise ops and reductions: a table of cases per
// rule (with and without partial sums) on a ("data"=2, "model"=4) mesh, each checked
// for its output sharding, its forward collectives, its value and its gradients against
// one device.
#include <gtest/gtest.h>

#include "distjax/global/elementwise.hpp"
#include "distjax/global/matmul.hpp"
#include "distjax/global/reduce.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/reduce.hpp"
#include "global/global_test_util.hpp"

namespace distjax::global {
namespace {

using testing::OpCase;
using testing::randn;
using N = std::nullopt_t;
constexpr auto None = std::nullopt;

const Mesh kMesh({2, 4}, {"data", "model"});

OpCase mm(std::string name, Shape sa, GlobalSharding a, Shape sb, GlobalSharding b,
          GlobalSharding out, std::string coll, bool trans_b = false) {
  return {std::move(name),
          {randn(sa, 1), randn(sb, 2)},
          {std::move(a), std::move(b)},
          [trans_b](const std::vector<GlobalArray>& x) { return matmul(x[0], x[1], trans_b); },
          [trans_b](const std::vector<Tensor>& x) {
            return tensor::matmul(x[0], x[1], false, trans_b);
          },
          std::move(out),
          std::move(coll)};
}

TEST(GlobalRules, Matmul) {
  const Shape a{8, 16}, b{16, 12};
  std::vector<OpCase> cases{
      mm("dp x column", a, {P("data", None)}, b, {P(None, "model")}, {P("data", "model")}, ""),
      mm("row parallel", a, {P(None, "model")}, b, {P("model", None)}, {P(), {"model"}}, ""),
      mm("2-D row parallel", a, {P("data", "model")}, b, {P("model", None)},
         {P("data", None), {"model"}}, ""),
      mm("partial x replicated", a, {P(), {"model"}}, b, {P()}, {P(), {"model"}}, ""),
      mm("partial x column: resolve", a, {P("data", None), {"model"}}, b, {P(None, "model")},
         {P("data", "model")}, "all_reduce@model"),
      mm("K mismatch: gather the small side", a, {P(None, "model")}, b, {P(None, "model")},
         {P(None, "model")}, "all_gather@model"),
      mm("fsdp weight", a, {P("data", None)}, b, {P("data", None)}, {P("data", None)},
         "all_gather@data"),
      mm("replicated x column", a, {P()}, b, {P(None, "model")}, {P(None, "model")}, ""),
      mm("tied head (trans_b)", a, {P("data", None)}, {12, 16}, {P()}, {P("data", None)}, "", true),
      mm("vocab-split head (trans_b)", a, {P("data", None)}, {12, 16}, {P("model", None)},
         {P("data", "model")}, "", true),
      mm("batched heads", {2, 4, 8, 8}, {P("data", "model")}, {2, 4, 8, 8}, {P("data", "model")},
         {P("data", "model")}, ""),
  };
  testing::check_op_cases(kMesh, cases);
}

TEST(GlobalRules, MatmulRuleIsPure) {
  const OpRule r = matmul_rule({8, 16}, {P("data", None)}, {16, 12}, {P(None, "model")}, kMesh);
  EXPECT_EQ(r.output.to_string(), "P(\"data\", \"model\")");
  EXPECT_EQ(r.bytes, 0);
}

OpCase ew(std::string name, Shape sa, GlobalSharding a, Shape sb, GlobalSharding b,
          GlobalSharding out, std::string coll, int kind) {
  auto op = [kind](const std::vector<GlobalArray>& x) {
    switch (kind) {
      case 0:
        return add(x[0], x[1]);
      case 1:
        return mul(x[0], x[1]);
      case 2:
        return sub(x[0], x[1]);
      default:
        return div(x[0], x[1]);
    }
  };
  auto ref = [kind](const std::vector<Tensor>& x) {
    switch (kind) {
      case 0:
        return tensor::add(x[0], x[1]);
      case 1:
        return tensor::mul(x[0], x[1]);
      case 2:
        return tensor::sub(x[0], x[1]);
      default:
        return tensor::div(x[0], x[1]);
    }
  };
  Tensor xb = randn(sb, 4);
  if (kind == 3) xb = tensor::add_scalar(tensor::square(xb), 1.0);  // a safe denominator
  return {std::move(name), {randn(sa, 3), xb}, {std::move(a), std::move(b)}, op, ref,
          std::move(out),  std::move(coll)};
}

TEST(GlobalRules, Elementwise) {
  const Shape a{8, 12};
  std::vector<OpCase> cases{
      ew("bias, split alike", a, {P("data", "model")}, {12}, {P("model")}, {P("data", "model")}, "",
         0),
      ew("replicated bias is split locally", a, {P("data", "model")}, {12}, {P()},
         {P("data", "model")}, "", 0),
      ew("partial + partial", a, {P(), {"model"}}, a, {P(), {"model"}}, {P(), {"model"}}, "", 0),
      ew("partial - partial", a, {P("data"), {"model"}}, a, {P("data"), {"model"}},
         {P("data"), {"model"}}, "", 2),
      ew("partial + replicated: all_reduce", a, {P(), {"model"}}, {12}, {P()}, {P()},
         "all_reduce@model", 0),
      ew("partial + split: reduce_scatter", a, {P(), {"model"}}, a, {P(None, "model")},
         {P(None, "model")}, "reduce_scatter@model", 0),
      ew("conflicting splits: all_to_all", a, {P("data", None)}, a, {P(None, "data")},
         {P("data", None)}, "all_to_all@data", 0),
      ew("partial * replicated stays partial", a, {P(), {"model"}}, a, {P("data")},
         {P("data"), {"model"}}, "", 1),
      ew("partial * partial: one resolves", a, {P(), {"model"}}, a, {P(), {"model"}},
         {P(), {"model"}}, "all_reduce@model", 1),
      ew("partial / replicated stays partial", a, {P(), {"data"}}, {12}, {P("model")},
         {P(None, "model"), {"data"}}, "", 3),
      ew("replicated / partial resolves", a, {P()}, {12}, {P(), {"data"}}, {P()}, "all_reduce@data",
         3),
  };
  testing::check_op_cases(kMesh, cases);
}

TEST(GlobalRules, UnaryOps) {
  const Shape a{8, 12};
  auto un = [&](std::string name, GlobalSharding s, GlobalSharding out, std::string coll,
                bool lin) {
    return OpCase{std::move(name),
                  {randn(a, 5)},
                  {std::move(s)},
                  [lin](const std::vector<GlobalArray>& x) {
                    return lin ? mul_scalar(x[0], 3.0) : gelu(x[0]);
                  },
                  [lin](const std::vector<Tensor>& x) {
                    return lin ? tensor::mul_scalar(x[0], 3.0) : tensor::gelu(x[0]);
                  },
                  std::move(out),
                  std::move(coll)};
  };
  testing::check_op_cases(
      kMesh,
      {un("gelu keeps splits", {P("data", "model")}, {P("data", "model")}, "", false),
       un("gelu resolves partial", {P("data"), {"model"}}, {P("data")}, "all_reduce@model", false),
       un("scale keeps partial", {P("data"), {"model"}}, {P("data"), {"model"}}, "", true)});
}

TEST(GlobalRules, Reductions) {
  const Shape a{8, 12};
  auto red = [&](std::string name, GlobalSharding s, GlobalSharding out, std::string coll,
                 int kind) {
    return OpCase{std::move(name),
                  {randn(a, 6)},
                  {std::move(s)},
                  [kind](const std::vector<GlobalArray>& x) {
                    if (kind == 0) return sum(x[0], {1});
                    if (kind == 1) return mean(x[0]);
                    if (kind == 2) return mean(x[0], {0}, true);
                    return max(x[0], {1});
                  },
                  [kind](const std::vector<Tensor>& x) {
                    if (kind == 0) return tensor::sum(x[0], {1});
                    if (kind == 1) return tensor::mean(x[0]);
                    if (kind == 2) return tensor::mean(x[0], {0}, true);
                    return tensor::max(x[0], {1});
                  },
                  std::move(out),
                  std::move(coll)};
  };
  testing::check_op_cases(
      kMesh,
      {red("sum over a split dim: partial", {P("data", "model")}, {P("data"), {"model"}}, "", 0),
       red("sum of partial stays partial", {P("data"), {"model"}}, {P("data"), {"model"}}, "", 0),
       red("mean of all", {P("data", "model")}, {P(), {"data", "model"}}, "", 1),
       red("mean keepdims", {P("data", "model")}, {P(None, "model"), {"data"}}, "", 2),
       red("max gathers the reduced dim", {P("data", "model")}, {P("data")}, "all_gather@model", 3),
       red("max resolves partial", {P("data"), {"model"}}, {P("data")}, "all_reduce@model", 3)});
}

}  // namespace
}  // namespace distjax::global
