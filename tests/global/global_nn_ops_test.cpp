// The propagation rules of softmax, log_softmax, layer and RMS norm, embedding,
// cross-entropy, reshape, transpose, slice, concat and attention: a table of cases per
// rule (with and without partial sums) on a ("data"=2, "model"=4) mesh, each checked for
// its output sharding, forward collectives, value and gradients against one device.
#include <gtest/gtest.h>

#include "distjax/global/attention.hpp"
#include "distjax/global/nn_ops.hpp"
#include "distjax/global/shape_ops.hpp"
#include "distjax/tensor/attention.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "global/global_test_util.hpp"

namespace distjax::global {
namespace {

using testing::OpCase;
using testing::randn;
constexpr auto None = std::nullopt;
using V = std::vector<GlobalArray>;
using T = std::vector<Tensor>;

const Mesh kMesh({2, 4}, {"data", "model"});

OpCase one(std::string name, Tensor x, GlobalSharding s, std::function<GlobalArray(const V&)> op,
           std::function<Tensor(const T&)> ref, GlobalSharding out, std::string coll) {
  return {std::move(name), {std::move(x)}, {std::move(s)}, std::move(op),
          std::move(ref),  std::move(out), std::move(coll)};
}

Tensor labels(const Shape& s, int v) {
  std::vector<std::int32_t> y(static_cast<std::size_t>(distjax::numel(s)));
  for (std::size_t i = 0; i < y.size(); ++i)
    y[i] = static_cast<std::int32_t>((i * 5 + 3) % v);
  return Tensor::from_vector(y, s);
}

TEST(GlobalRules, SoftmaxAndLogSoftmax) {
  const Tensor x = randn({8, 12}, 1);
  auto sm = [](const V& v) { return softmax(v[0]); };
  auto sm_ref = [](const T& t) { return tensor::softmax(t[0]); };
  auto lsm = [](const V& v) { return log_softmax(v[0], 0); };
  auto lsm_ref = [](const T& t) { return tensor::log_softmax(t[0], 0); };
  testing::check_op_cases(
      kMesh, {one("rows split: no communication", x, {P("data")}, sm, sm_ref, {P("data")}, ""),
              one("the softmax dim is gathered", x, {P("data", "model")}, sm, sm_ref, {P("data")},
                  "all_gather@model"),
              one("partial is resolved", x, {P("data"), {"model"}}, sm, sm_ref, {P("data")},
                  "all_reduce@model"),
              one("log_softmax over dim 0", x, {P("data", "model")}, lsm, lsm_ref,
                  {P(None, "model")}, "all_gather@data")});
}

TEST(GlobalRules, Norms) {
  const Tensor x = randn({4, 2, 8}, 2), g = randn({8}, 3), b = randn({8}, 4);
  auto ln = [](const V& v) { return layer_norm(v[0], v[1], v[2]); };
  auto ln_ref = [](const T& t) { return tensor::layer_norm(t[0], t[1], t[2]); };
  auto rms = [](const V& v) { return rms_norm(v[0], v[1]); };
  auto rms_ref = [](const T& t) { return tensor::rms_norm(t[0], t[1]); };
  testing::check_op_cases(kMesh, {OpCase{"layer_norm, batch split",
                                         {x, g, b},
                                         {{P("data")}, {P()}, {P()}},
                                         ln,
                                         ln_ref,
                                         {P("data")},
                                         ""},
                                  OpCase{"layer_norm gathers C",
                                         {x, g, b},
                                         {{P("data", None, "model")}, {P()}, {P("model")}},
                                         ln,
                                         ln_ref,
                                         {P("data")},
                                         "all_gather@model all_gather@model"},
                                  OpCase{"layer_norm resolves partial",
                                         {x, g, b},
                                         {{P(), {"model"}}, {P()}, {P()}},
                                         ln,
                                         ln_ref,
                                         {P()},
                                         "all_reduce@model"},
                                  OpCase{"rms_norm gathers C",
                                         {x, g},
                                         {{P("data", None, "model")}, {P()}},
                                         rms,
                                         rms_ref,
                                         {P("data")},
                                         "all_gather@model"}});
}

TEST(GlobalRules, Embedding) {
  const Tensor table = randn({16, 8}, 5), ids = labels({4, 2}, 16);
  auto emb = [](const V& v) { return embedding(v[0], v[1]); };
  auto emb_ref = [](const T& t) { return tensor::embedding(t[0], t[1]); };
  testing::check_op_cases(
      kMesh,
      {OpCase{
           "replicated table", {table, ids}, {{P()}, {P("data")}}, emb, emb_ref, {P("data")}, ""},
       OpCase{"table split by columns",
              {table, ids},
              {{P(None, "model")}, {P("data")}},
              emb,
              emb_ref,
              {P("data", None, "model")},
              ""},
       OpCase{"vocabulary-parallel: partial",
              {table, ids},
              {{P("model", None)}, {P("data")}},
              emb,
              emb_ref,
              {P("data"), {"model"}},
              ""},
       OpCase{"ids split like the table: ids gathered",
              {table, ids},
              {{P("data", None)}, {P("data")}},
              emb,
              emb_ref,
              {P(), {"data"}},
              "all_gather@data"}});
}

TEST(GlobalRules, CrossEntropy) {
  const Tensor logits = randn({8, 16}, 6), y = labels({8}, 16);
  auto ce = [](const V& v) { return cross_entropy(v[0], v[1]); };
  auto ce_ref = [](const T& t) { return tensor::cross_entropy(t[0], t[1]); };
  const Tensor big = randn({4, 256}, 7), yb = labels({4}, 256);
  const Tensor small = randn({8, 4}, 8), ys = labels({8}, 4);
  testing::check_op_cases(
      kMesh,
      {OpCase{"batch split", {logits, y}, {{P("data")}, {P("data")}}, ce, ce_ref, {P("data")}, ""},
       OpCase{"labels follow the logits",
              {logits, y},
              {{P("data")}, {P()}},
              ce,
              ce_ref,
              {P("data")},
              ""},
       OpCase{"partial logits resolved",
              {logits, y},
              {{P("data"), {"model"}}, {P("data")}},
              ce,
              ce_ref,
              {P("data")},
              "all_reduce@model"},
       OpCase{"V split, few rows: vocabulary-parallel",
              {logits, y},
              {{P("data", "model")}, {P("data")}},
              ce,
              ce_ref,
              {P("data")},
              "all_reduce@model all_reduce@model all_reduce@model"},
       OpCase{"V split, V small: gathered",
              {small, ys},
              {{P(None, "model")}, {P()}},
              ce,
              ce_ref,
              {P()},
              "all_gather@model"},
       OpCase{"large V split: vocabulary-parallel",
              {big, yb},
              {{P(None, "model")}, {P()}},
              ce,
              ce_ref,
              {P()},
              "all_reduce@model all_reduce@model all_reduce@model"}});
}

TEST(GlobalRules, ShapeOps) {
  const Tensor x = randn({4, 2, 24}, 8);
  auto rs = [](Shape s) { return [s](const V& v) { return reshape(v[0], s); }; };
  auto rs_ref = [](Shape s) { return [s](const T& t) { return tensor::reshape(t[0], s); }; };
  auto tr = [](const V& v) { return transpose(v[0], 0, 2); };
  auto tr_ref = [](const T& t) { return tensor::transpose(t[0], 0, 2); };
  auto sl = [](const V& v) { return slice(v[0], 2, 4, 12); };
  auto sl_ref = [](const T& t) { return tensor::slice(t[0], 2, 4, 12); };
  auto cc = [](const V& v) { return concat({v[0], v[1]}, 1); };
  auto cc_ref = [](const T& t) { return tensor::concat({t[0], t[1]}, 1); };
  const Tensor y = randn({4, 2, 24}, 9);
  testing::check_op_cases(
      kMesh, {one("merge keeps the major split", x, {P("data")}, rs({8, 24}), rs_ref({8, 24}),
                  {P("data")}, ""),
              one("split of features into heads", x, {P(None, None, "model")}, rs({4, 2, 4, 3, 2}),
                  rs_ref({4, 2, 4, 3, 2}), {P(None, None, "model")}, ""),
              one("minor split in a merge is gathered", x, {P(None, "data")}, rs({8, 24}),
                  rs_ref({8, 24}), {P()}, "all_gather@data"),
              one("reshape keeps partial", x, {P("data"), {"model"}}, rs({8, 24}), rs_ref({8, 24}),
                  {P("data"), {"model"}}, ""),
              one("transpose moves entries", x, {P("data", None, "model")}, tr, tr_ref,
                  {P("model", None, "data")}, ""),
              one("slice gathers its dim", x, {P("data", None, "model")}, sl, sl_ref, {P("data")},
                  "all_gather@model"),
              one("slice keeps partial", x, {P("data"), {"model"}}, sl, sl_ref,
                  {P("data"), {"model"}}, ""),
              OpCase{"concat",
                     {x, y},
                     {{P("data")}, {P("data", None, "model")}},
                     cc,
                     cc_ref,
                     {P("data")},
                     "all_gather@model"},
              OpCase{"concat of partials",
                     {x, y},
                     {{P(), {"model"}}, {P(), {"model"}}},
                     cc,
                     cc_ref,
                     {P(), {"model"}},
                     ""}});
}

// The rules normalise a negative axis and refuse one out of range, naming the global op.
TEST(GlobalRules, AxisOutOfRangeNamesTheOp) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no InvalidArgument");
  };
  const Shape s{4, 2, 24};
  const GlobalSharding g{P("data")};
  EXPECT_NE(message([&] { softmax_rule(s, g, 3, kMesh); })
                .find("[global::softmax] axis 3 is out of range for rank 3"),
            std::string::npos);
  EXPECT_NE(message([&] { slice_rule(s, g, -4, 0, 1, kMesh); })
                .find("[global::slice] axis -4 is out of range for rank 3"),
            std::string::npos);
  EXPECT_NE(message([&] { concat_rule({s, s}, {g, g}, 3, kMesh); })
                .find("[global::concat] axis 3"),
            std::string::npos);
  EXPECT_EQ(slice_rule(s, g, -1, 0, 12, kMesh).output, slice_rule(s, g, 2, 0, 12, kMesh).output);
}

TEST(GlobalRules, Attention) {
  const Tensor q = randn({2, 4, 8, 4}, 10), k = randn({2, 4, 8, 4}, 11),
               v = randn({2, 4, 8, 4}, 12);
  auto at = [](const V& x) { return attention(x[0], x[1], x[2]); };
  auto at_ref = [](const T& t) { return tensor::attention(t[0], t[1], t[2], true); };
  const Tensor qkv = randn({2, 8, 24}, 13);  // C = 8, H = 4
  auto ap = [](const V& x) { return attention_packed(x[0], 4); };
  auto ap_ref = [](const T& t) { return tensor::attention_packed(t[0], 4, true); };
  testing::check_op_cases(
      kMesh,
      {OpCase{"heads over model, batch over data",
              {q, k, v},
              {{P("data", "model")}, {P("data", "model")}, {P("data", "model")}},
              at,
              at_ref,
              {P("data", "model")},
              ""},
       OpCase{"k, v follow q",
              {q, k, v},
              {{P("data", "model")}, {P()}, {P()}},
              at,
              at_ref,
              {P("data", "model")},
              ""},
       OpCase{"sequence split is gathered",
              {q, k, v},
              {{P(None, None, "model")}, {P()}, {P()}},
              at,
              at_ref,
              {P()},
              "all_gather@model"},
       one("packed, heads over model", qkv, {P("data", None, "model")}, ap, ap_ref,
           {P("data", None, "model")}, ""),
       one("packed, partial resolved", qkv, {P("data"), {"model"}}, ap, ap_ref, {P("data")},
           "all_reduce@model")},
      2e-5);
}

}  // namespace
}  // namespace distjax::global
