// Every differentiable op of include/distjax/tensor/*.hpp against finite differences:
// one GradCase per op (or per variant of an op), each with its own tolerance.
#include <gtest/gtest.h>

#include "grad_check.hpp"

namespace distjax::testing {
namespace {

using namespace distjax::tensor;
using V = std::vector<Tensor>;

std::vector<GradCase> elementwise_cases() {
  std::vector<GradCase> c;
  // Binary ops, with every broadcasting layout the kernels special-case.
  c.push_back({"add_same", {uniform({2, 3}, 1), uniform({2, 3}, 2)}, one([](const V& x) {
                 return add(x[0], x[1]);
               })});
  c.push_back({"add_row", {uniform({3, 4}, 3), uniform({4}, 4)}, one([](const V& x) {
                 return add(x[0], x[1]);
               })});
  c.push_back({"add_row_left", {uniform({4}, 5), uniform({3, 4}, 6)}, one([](const V& x) {
                 return add(x[0], x[1]);
               })});
  c.push_back({"add_col", {uniform({3, 1}, 7), uniform({3, 4}, 8)}, one([](const V& x) {
                 return add(x[0], x[1]);
               })});
  c.push_back({"add_outer", {uniform({3, 1}, 9), uniform({1, 4}, 10)}, one([](const V& x) {
                 return add(x[0], x[1]);
               })});
  c.push_back({"add_general", {uniform({2, 3, 4}, 11), uniform({2, 1, 4}, 12)}, one([](const V& x) {
                 return add(x[0], x[1]);
               })});
  c.push_back({"add_scalar_tensor", {uniform({}, 13), uniform({2, 3}, 14)}, one([](const V& x) {
                 return add(x[0], x[1]);
               })});
  c.push_back({"sub_same", {uniform({2, 3}, 15), uniform({2, 3}, 16)}, one([](const V& x) {
                 return sub(x[0], x[1]);
               })});
  c.push_back({"sub_row_left", {uniform({4}, 17), uniform({3, 4}, 18)}, one([](const V& x) {
                 return sub(x[0], x[1]);
               })});
  c.push_back({"mul_same", {uniform({2, 3}, 19), uniform({2, 3}, 20)}, one([](const V& x) {
                 return mul(x[0], x[1]);
               })});
  c.push_back({"mul_col", {uniform({2, 3, 4}, 21), uniform({2, 3, 1}, 22)}, one([](const V& x) {
                 return mul(x[0], x[1]);
               })});
  c.push_back({"mul_general", {uniform({2, 3, 4}, 23), uniform({3, 1}, 24)}, one([](const V& x) {
                 return mul(x[0], x[1]);
               })});
  c.push_back({"div_same",
               {uniform({2, 3}, 25), uniform({2, 3}, 26, 0.5f, 2.f)},
               one([](const V& x) { return div(x[0], x[1]); })});
  c.push_back({"div_row", {uniform({3, 4}, 27), uniform({4}, 28, 0.5f, 2.f)}, one([](const V& x) {
                 return div(x[0], x[1]);
               })});
  {
    // maximum away from ties: b = a + an offset of magnitude >= 0.2.
    Tensor a = uniform({3, 4}, 29);
    Tensor b = add(a, away_from_zero({3, 4}, 30, 0.2f, 1.f));
    c.push_back({"maximum_same", {a, b}, one([](const V& x) { return maximum(x[0], x[1]); })});
    Tensor r = away_from_zero({4}, 31, 0.2f, 1.f);
    Tensor m = add(mul_scalar(away_from_zero({3, 4}, 32, 0.2f, 1.f), 2.0), r);
    c.push_back({"maximum_row", {m, r}, one([](const V& x) { return maximum(x[0], x[1]); })});
  }
  // Scalar ops.
  c.push_back(
      {"add_scalar", {uniform({2, 3}, 33)}, one([](const V& x) { return add_scalar(x[0], 1.5); })});
  c.push_back({"mul_scalar", {uniform({2, 3}, 34)}, one([](const V& x) {
                 return mul_scalar(x[0], -2.5);
               })});
  c.push_back({"pow_scalar", {uniform({2, 3}, 35, 0.5f, 2.f)}, one([](const V& x) {
                 return pow_scalar(x[0], 2.5);
               })});
  c.push_back({"pow_scalar_neg", {uniform({2, 3}, 36, 0.5f, 2.f)}, one([](const V& x) {
                 return pow_scalar(x[0], -1.5);
               })});
  // Unary ops; log, sqrt, rsqrt on positive, well-conditioned inputs.
  c.push_back({"neg", {uniform({2, 3}, 37)}, one([](const V& x) { return neg(x[0]); })});
  c.push_back({"exp", {uniform({2, 3}, 38)}, one([](const V& x) { return exp(x[0]); })});
  c.push_back({"log", {uniform({2, 3}, 39, 0.5f, 2.f)}, one([](const V& x) { return log(x[0]); })});
  c.push_back(
      {"sqrt", {uniform({2, 3}, 40, 0.5f, 2.f)}, one([](const V& x) { return sqrt(x[0]); })});
  c.push_back(
      {"rsqrt", {uniform({2, 3}, 41, 0.5f, 2.f)}, one([](const V& x) { return rsqrt(x[0]); })});
  c.push_back({"square", {uniform({2, 3}, 42)}, one([](const V& x) { return square(x[0]); })});
  c.push_back(
      {"tanh", {uniform({2, 3}, 43, -2.f, 2.f)}, one([](const V& x) { return tanh(x[0]); })});
  c.push_back(
      {"sigmoid", {uniform({2, 3}, 44, -3.f, 3.f)}, one([](const V& x) { return sigmoid(x[0]); })});
  c.push_back({"relu", {away_from_zero({3, 4}, 45, 0.1f, 1.f)}, one([](const V& x) {
                 return relu(x[0]);
               })});
  c.push_back({"gelu_tanh", {uniform({3, 4}, 46, -3.f, 3.f)}, one([](const V& x) {
                 return gelu(x[0], true);
               })});
  c.push_back({"gelu_erf", {uniform({3, 4}, 47, -3.f, 3.f)}, one([](const V& x) {
                 return gelu(x[0], false);
               })});
  c.push_back(
      {"silu", {uniform({3, 4}, 48, -3.f, 3.f)}, one([](const V& x) { return silu(x[0]); })});
  {
    Tensor cond_f = Tensor::from_vector<float>({1, 0, 1, 0, 0, 1}, {2, 3});
    c.push_back({"where_f32_cond",
                 {uniform({2, 3}, 49), uniform({3}, 50)},
                 one([cond_f](const V& x) { return where(cond_f, x[0], x[1]); })});
    Tensor cond_i = Tensor::from_vector<std::int32_t>({0, 1, 1}, {3});
    c.push_back({"where_i32_cond_broadcast",
                 {uniform({2, 3}, 51), uniform({2, 1}, 52)},
                 one([cond_i](const V& x) { return where(cond_i, x[0], x[1]); })});
  }
  // f32 -> f16 -> f32 keeps enough precision for differences with a large step.
  c.push_back({"astype_f16_chain",
               {uniform({2, 3}, 53)},
               one([](const V& x) { return astype(astype(x[0], DType::F16), DType::F32); }),
               1e-1,
               1e-2,
               1e-2});
  return c;
}

std::vector<GradCase> matmul_cases() {
  std::vector<GradCase> c;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const std::string tag = std::string(ta ? "T" : "N") + (tb ? "T" : "N");
      const Shape sa = ta ? Shape{4, 3} : Shape{3, 4}, sb = tb ? Shape{5, 4} : Shape{4, 5};
      c.push_back({"matmul_" + tag,
                   {uniform(sa, 60 + 2 * ta + tb), uniform(sb, 70 + 2 * ta + tb)},
                   one([ta, tb](const V& x) { return matmul(x[0], x[1], ta, tb); })});
      const Shape ba = ta ? Shape{2, 4, 3} : Shape{2, 3, 4},
                  bb = tb ? Shape{2, 5, 4} : Shape{2, 4, 5};
      c.push_back({"matmul_batched_" + tag,
                   {uniform(ba, 80 + 2 * ta + tb), uniform(bb, 90 + 2 * ta + tb)},
                   one([ta, tb](const V& x) { return matmul(x[0], x[1], ta, tb); })});
      // A batched a against a 2-D b shared by every batch element.
      c.push_back({"matmul_shared_b_" + tag,
                   {uniform(ba, 100 + 2 * ta + tb), uniform(sb, 110 + 2 * ta + tb)},
                   one([ta, tb](const V& x) { return matmul(x[0], x[1], ta, tb); })});
    }
  c.push_back({"matmul_4d",
               {uniform({2, 2, 3, 4}, 120), uniform({2, 2, 4, 3}, 121)},
               one([](const V& x) { return matmul(x[0], x[1]); })});
  c.push_back({"matmul_4d_shared_b",
               {uniform({2, 2, 3, 4}, 122), uniform({4, 3}, 123)},
               one([](const V& x) { return matmul(x[0], x[1]); })});
  c.push_back({"linear_bias",
               {uniform({2, 3, 4}, 124), uniform({4, 5}, 125), uniform({5}, 126)},
               one([](const V& x) { return linear(x[0], x[1], x[2]); })});
  c.push_back({"linear_no_bias", {uniform({3, 4}, 127), uniform({4, 5}, 128)}, one([](const V& x) {
                 return linear(x[0], x[1]);
               })});
  return c;
}

std::vector<GradCase> reduce_cases() {
  std::vector<GradCase> c;
  c.push_back({"sum_all", {uniform({2, 3, 4}, 130)}, one([](const V& x) { return sum(x[0]); })});
  c.push_back(
      {"sum_axis0", {uniform({2, 3, 4}, 131)}, one([](const V& x) { return sum(x[0], {0}); })});
  c.push_back({"sum_leading_keepdims", {uniform({2, 3, 4}, 132)}, one([](const V& x) {
                 return sum(x[0], {0, 1}, true);
               })});
  c.push_back({"sum_outer_axes", {uniform({2, 3, 4}, 133)}, one([](const V& x) {
                 return sum(x[0], {0, -1});
               })});
  c.push_back({"sum_middle_keepdims", {uniform({2, 3, 4}, 134)}, one([](const V& x) {
                 return sum(x[0], {1}, true);
               })});
  c.push_back({"mean_all", {uniform({2, 3, 4}, 135)}, one([](const V& x) { return mean(x[0]); })});
  c.push_back(
      {"mean_last", {uniform({2, 3, 4}, 136)}, one([](const V& x) { return mean(x[0], {-1}); })});
  c.push_back({"mean_keepdims", {uniform({2, 3, 4}, 137)}, one([](const V& x) {
                 return mean(x[0], {0, 2}, true);
               })});
  // max on distinct values (gap 0.1 > 2 eps), so the maximiser never changes.
  c.push_back({"max_all", {distinct({2, 3, 4}, 138)}, one([](const V& x) { return max(x[0]); })});
  c.push_back(
      {"max_last", {distinct({2, 3, 4}, 139)}, one([](const V& x) { return max(x[0], {-1}); })});
  c.push_back({"max_first_keepdims", {distinct({2, 3, 4}, 140)}, one([](const V& x) {
                 return max(x[0], {0}, true);
               })});
  c.push_back({"max_two_axes", {distinct({2, 3, 4}, 141)}, one([](const V& x) {
                 return max(x[0], {0, 2});
               })});
  c.push_back({"sum_to_rows", {uniform({2, 3, 4}, 142)}, one([](const V& x) {
                 return sum_to(x[0], {3, 1});
               })});
  c.push_back(
      {"sum_to_bias", {uniform({5, 4}, 143)}, one([](const V& x) { return sum_to(x[0], {4}); })});
  c.push_back({"sum_to_ones", {uniform({2, 3}, 144)}, one([](const V& x) {
                 return sum_to(x[0], {1, 1});
               })});
  return c;
}

std::vector<GradCase> shape_cases() {
  std::vector<GradCase> c;
  c.push_back({"reshape", {uniform({2, 3, 4}, 150)}, one([](const V& x) {
                 return reshape(x[0], {4, -1});
               })});
  c.push_back({"transpose_last", {uniform({2, 3, 4}, 151)}, one([](const V& x) {
                 return transpose(x[0]);
               })});
  c.push_back({"transpose_0_2", {uniform({2, 3, 4}, 152)}, one([](const V& x) {
                 return transpose(x[0], 0, 2);
               })});
  c.push_back({"permute", {uniform({2, 3, 4}, 153)}, one([](const V& x) {
                 return permute(x[0], {2, 0, 1});
               })});
  c.push_back(
      {"slice", {uniform({2, 5, 3}, 154)}, one([](const V& x) { return slice(x[0], 1, 1, 4); })});
  c.push_back({"slice_negative", {uniform({4, 3}, 155)}, one([](const V& x) {
                 return slice(x[0], -1, -2, 3);
               })});
  c.push_back({"concat",
               {uniform({2, 1, 3}, 156), uniform({2, 3, 3}, 157), uniform({2, 2, 3}, 158)},
               one([](const V& x) { return concat(x, 1); })});
  c.push_back({"split_sizes", {uniform({2, 6}, 159)}, [](const V& x) {
                 return split(x[0], std::vector<std::int64_t>{1, 3, 2}, 1);
               }});
  c.push_back(
      {"split_equal", {uniform({4, 3}, 160)}, [](const V& x) { return split(x[0], 2, 0); }});
  // Only the middle part is used: the other parts' cotangents are undefined (zeros).
  c.push_back({"split_one_part_used", {uniform({2, 6}, 168)}, [](const V& x) {
                 return V{split(x[0], std::vector<std::int64_t>{1, 3, 2}, 1)[1]};
               }});
  c.push_back({"stack_0", {uniform({2, 3}, 161), uniform({2, 3}, 162)}, one([](const V& x) {
                 return stack(x, 0);
               })});
  c.push_back({"stack_last",
               {uniform({2, 3}, 163), uniform({2, 3}, 164), uniform({2, 3}, 165)},
               one([](const V& x) { return stack(x, -1); })});
  c.push_back({"broadcast_to", {uniform({3, 1}, 166)}, one([](const V& x) {
                 return broadcast_to(x[0], {2, 3, 4});
               })});
  c.push_back({"broadcast_to_row", {uniform({4}, 167)}, one([](const V& x) {
                 return broadcast_to(x[0], {3, 4});
               })});
  return c;
}

std::vector<GradCase> nn_cases() {
  std::vector<GradCase> c;
  c.push_back({"softmax_last", {uniform({3, 5}, 170, -2.f, 2.f)}, one([](const V& x) {
                 return softmax(x[0]);
               })});
  c.push_back({"softmax_axis0", {uniform({4, 3, 2}, 171, -2.f, 2.f)}, one([](const V& x) {
                 return softmax(x[0], 0);
               })});
  c.push_back({"log_softmax_last", {uniform({3, 5}, 172, -2.f, 2.f)}, one([](const V& x) {
                 return log_softmax(x[0]);
               })});
  c.push_back({"log_softmax_axis1", {uniform({2, 4, 3}, 173, -2.f, 2.f)}, one([](const V& x) {
                 return log_softmax(x[0], 1);
               })});
  c.push_back(
      {"layer_norm",
       {uniform({2, 3, 6}, 174, -2.f, 2.f), uniform({6}, 175, 0.5f, 1.5f), uniform({6}, 176)},
       one([](const V& x) { return layer_norm(x[0], x[1], x[2]); })});
  c.push_back({"layer_norm_no_beta",
               {uniform({4, 5}, 177, -2.f, 2.f), uniform({5}, 178, 0.5f, 1.5f)},
               one([](const V& x) { return layer_norm(x[0], x[1], Tensor()); })});
  c.push_back({"rms_norm",
               {uniform({3, 6}, 179, -2.f, 2.f), uniform({6}, 180, 0.5f, 1.5f)},
               one([](const V& x) { return rms_norm(x[0], x[1]); })});
  {
    Tensor ids32 = Tensor::from_vector<std::int32_t>({3, 1, 3, 0, 3, 2}, {2, 3});  // 3 repeats
    c.push_back({"embedding_repeated_i32", {uniform({5, 4}, 181)}, one([ids32](const V& x) {
                   return embedding(x[0], ids32);
                 })});
    Tensor ids64 = Tensor::from_vector<std::int64_t>({4, 4, 0}, {3});
    c.push_back({"embedding_i64", {uniform({5, 2}, 182)}, one([ids64](const V& x) {
                   return embedding(x[0], ids64);
                 })});
    Tensor labels = Tensor::from_vector<std::int32_t>({2, 0, 4, 4, 1, 3}, {2, 3});
    c.push_back({"cross_entropy", {uniform({2, 3, 5}, 183, -2.f, 2.f)}, one([labels](const V& x) {
                   return cross_entropy(x[0], labels);
                 })});
    Tensor labels64 = Tensor::from_vector<std::int64_t>({1, 0}, {2});
    c.push_back({"cross_entropy_i64",
                 {uniform({2, 7}, 184, -3.f, 3.f)},
                 one([labels64](const V& x) { return cross_entropy(x[0], labels64); })});
  }
  c.push_back({"dropout", {uniform({4, 8}, 185)}, one([](const V& x) {
                 return dropout(x[0], 0.3f, Key::from_seed(7));
               })});
  // Attention: causal square, non-causal with T != S, causal with T < S, custom scale.
  c.push_back({"attention_causal",
               {uniform({2, 2, 5, 4}, 186), uniform({2, 2, 5, 4}, 187), uniform({2, 2, 5, 4}, 188)},
               one([](const V& x) { return attention(x[0], x[1], x[2], true); })});
  c.push_back({"attention_full_t_ne_s",
               {uniform({1, 2, 3, 4}, 189), uniform({1, 2, 6, 4}, 190), uniform({1, 2, 6, 4}, 191)},
               one([](const V& x) { return attention(x[0], x[1], x[2], false); })});
  c.push_back({"attention_causal_t_lt_s",
               {uniform({2, 1, 3, 4}, 192), uniform({2, 1, 5, 4}, 193), uniform({2, 1, 5, 4}, 194)},
               one([](const V& x) { return attention(x[0], x[1], x[2], true, 0.7f); })});
  // Longer than one row block of the kernel, so the blocked causal path is covered.
  c.push_back(
      {"attention_causal_multi_block",
       {uniform({1, 1, 37, 3}, 195), uniform({1, 1, 37, 3}, 196), uniform({1, 1, 37, 3}, 197)},
       one([](const V& x) { return attention(x[0], x[1], x[2], true); })});
  return c;
}

std::vector<GradCase> all_cases() {
  std::vector<GradCase> all;
  for (auto part : {elementwise_cases, matmul_cases, reduce_cases, shape_cases, nn_cases})
    for (GradCase& c : part())
      all.push_back(std::move(c));
  return all;
}

class OpsGrad : public ::testing::TestWithParam<GradCase> {};

TEST_P(OpsGrad, MatchesFiniteDifferences) {
  EXPECT_TRUE(check_gradients(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Tensor, OpsGrad, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<GradCase>& info) {
                           return info.param.name;
                         });

TEST(OpsGradHarness, CatchesAWrongGradient) {
  // A deliberately wrong VJP (twice the true gradient) must be reported.
  GradCase bad{
      "bad_vjp", {uniform({3}, 300)}, one([](const V& x) {
        return autodiff::custom_vjp1(
            "bad", {x[0]}, [](const V& in) { return V{square(in[0])}; },
            [](const V& in, const V&, const V& g) { return V{mul(mul_scalar(in[0], 4.0), g[0])}; });
      })};
  EXPECT_FALSE(check_gradients(bad));
}

// bf16 cannot be differenced with a small step; check the chain's VJP by value: the
// cotangent of f32 -> bf16 -> f32 is the output cotangent rounded to bf16.
TEST(OpsGradHarness, AstypeBf16ChainCastsTheCotangent) {
  TensorTree p;
  p.set("x", uniform({8}, 301));
  Tensor ct =
      Tensor::from_vector<float>({1.f, -2.f, 0.1f, 3.14159f, 1e-3f, 257.f, -0.3f, 65.5f}, {8});
  auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& q) {
    Tensor y = astype(astype(q.at("x"), DType::BF16), DType::F32);
    EXPECT_EQ(y.dtype(), DType::F32);
    return sum(mul(y, ct));
  })(p);
  const auto expect = astype(astype(ct, DType::BF16), DType::F32).to_vector<float>();
  const auto got = g.at("x").to_vector<float>();
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i], expect[i]) << i;
  // And the value is x rounded to bf16 (8 significant bits).
  const auto x = p.at("x").to_vector<float>();
  const auto y = astype(astype(p.at("x"), DType::BF16), DType::F32).to_vector<float>();
  for (std::size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(y[i], x[i], std::abs(x[i]) * (1.f / 256.f));
  EXPECT_NE(expect[2], 0.1f);  // bf16 rounding is visible in the cotangent
}

}  // namespace
}  // namespace distjax::testing
