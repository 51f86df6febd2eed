// Sharding rules by path, the table of what each device holds, the lint of the two
// pitfalls, and the blog guide's flow: initialise on the host, place by rules, run the
// tensor-parallel model on the placed shards.
#include "distjax/parallel/sharding_rules.hpp"

#include <gtest/gtest.h>

#include "distjax/models/transformer.hpp"
#include "distjax/spmd/shard_map.hpp"

namespace distjax::parallel {
namespace {

using mesh::Mesh;
using mesh::P;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

TEST(ShardingRules, FirstMatchWinsAndTheRestIsReplicated) {
  const ShardingRules rules({{"qkv/kernel$", P(std::nullopt, "model")},
                             {"kernel$", P("model", std::nullopt)},
                             {"^wte/", P("model", std::nullopt)}});
  EXPECT_EQ(rules.spec_for("blocks/0/attn/qkv/kernel"), P(std::nullopt, "model"));
  EXPECT_EQ(rules.spec_for("blocks/0/mlp/fc2/kernel"), P("model", std::nullopt));
  EXPECT_EQ(rules.rule_for("blocks/0/mlp/fc2/kernel"), 1);
  EXPECT_EQ(rules.spec_for("ln_f/scale"), P());
  EXPECT_EQ(rules.rule_for("ln_f/scale"), -1);
  const std::string bad = error_of([] { ShardingRules({{"(", P()}}); });
  EXPECT_NE(bad.find("pattern \"(\" is not a valid regular expression"), std::string::npos) << bad;
}

TEST(ShardingRules, SpecsAreValidatedOnTheMesh) {
  tensor::TensorTree params;
  params.set("fc/kernel", Tensor::zeros({6, 8}));
  const Mesh mesh({4}, {"model"});
  const std::string msg = error_of([&] {
    ShardingRules({{"kernel", P("model", std::nullopt)}}).specs_for(params, mesh);
  });
  EXPECT_NE(msg.find("rule 0 (\"kernel\" -> P(\"model\", None)) does not fit parameter "
                     "\"fc/kernel\""),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("(6, 8)"), std::string::npos) << msg;
}

TEST(ShardingRules, HostInitPlacedByRulesRunsTheTensorParallelModel) {
  // The blog's flow: parameters made on the host, placed with shard_param's rules, and the
  // Megatron GPT run on each device's shards gives the single-device logits' loss.
  models::TransformerConfig c{
      .vocab = 32, .d_model = 16, .num_layers = 1, .num_heads = 4, .mlp_ratio = 2, .max_len = 8};
  const models::Transformer plain(c);
  c.tp = {.layout = TPLayout::Megatron};
  const models::Transformer tp(c);
  const tensor::TensorTree host = plain.init(Key::from_seed(3));
  // First match wins: a rule for kernels and biases together gives the 1-D biases a 2-D
  // spec, which validation rejects; the bias rule must come first.
  const ShardingRules rules({{"(qkv|fc1)/(kernel|bias)$", P(std::nullopt, "model")},
                             {"(qkv|fc1)/bias$", P("model")},
                             {"(out|fc2)/kernel$", P("model", std::nullopt)}});
  const ShardingRules ordered({{"(qkv|fc1)/bias$", P("model")},
                               {"(qkv|fc1)/kernel$", P(std::nullopt, "model")},
                               {"(out|fc2)/kernel$", P("model", std::nullopt)}});
  const Mesh mesh({2, 2}, {"data", "model"});
  EXPECT_THROW(rules.specs_for(host, mesh), ShardingError);  // P(None, "model") on a bias
  // The model's own specs are exactly what the rules give.
  nn::ParamSpecs model_specs;
  spmd::shard_map(mesh,
                  [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
                    nn::ParamSpecs s;
                    tp.init(Key::from_seed(3), &s, &ctx);
                    if (ctx.device() == 0) model_specs = s;
                    return std::vector<Tensor>{};
                  },
                  {}, {})(std::vector<Tensor>{});
  const nn::ParamSpecs specs = ordered.specs_for(host, mesh);
  EXPECT_EQ(specs, model_specs);

  const auto placed = place_params(host, ordered, mesh);
  std::vector<std::string> paths;
  std::vector<mesh::ShardedArray> inputs;
  std::vector<mesh::PartitionSpec> in_specs;
  for (const auto& [path, array] : placed) {
    paths.push_back(path);
    inputs.push_back(array);
    in_specs.push_back(specs.count(path) ? specs.at(path) : P());
  }
  std::vector<std::int32_t> ids(16);
  for (std::int64_t i = 0; i < 16; ++i)
    ids[i] = static_cast<int>(i % 32);
  Tensor tokens = Tensor::from_vector(ids, {2, 8}), targets = Tensor::ones({2, 8}, DType::I32);
  const double want = plain.loss(nn::Scope::apply(&host, false), tokens, targets).item<double>();
  auto f = spmd::shard_map(mesh,
                           [&](spmd::DeviceContext& ctx, const std::vector<Tensor>& in) {
                             tensor::TensorTree local;
                             for (std::size_t i = 0; i < paths.size(); ++i)
                               local.set(paths[i], in[i]);
                             return std::vector<Tensor>{
                                 tp.loss(nn::Scope::apply(&local, false).on(ctx), tokens, targets)};
                           },
                           in_specs, {P()});
  EXPECT_NEAR(mesh::gather(f(inputs)[0]).item<double>(), want, 1e-5 * want);
}

TEST(ShardingTable, OneRowPerParameterAndATotal) {
  const Mesh mesh({2, 4}, {"data", "model"});
  const std::map<std::string, Shape> shapes{{"a/kernel", {8, 16}}, {"a/bias", {16}}};
  const nn::ParamSpecs specs{{"a/kernel", P(std::nullopt, "model")}};
  const std::string t = sharding_table(shapes, specs, mesh);
  EXPECT_EQ(t,
            "parameter  global shape  spec              on each device  bytes\n"
            "a/bias     (16,)         P()               (16,)              64\n"
            "a/kernel   (8, 16)       P(None, \"model\")  (8, 4)            128\n"
            "total                                                        192\n"
            "bytes per device: 192 of 576 replicated (33.3%) on mesh (\"data\"=2, "
            "\"model\"=4)\n");
}

TEST(LintSharding, WeightsSplitOverADataAxisUnderPlainDataParallelism) {
  const Mesh mesh({4}, {"data"});
  const nn::ParamSpecs specs{{"fc1/kernel", P("data", std::nullopt)}};
  const auto findings = lint_sharding(specs, mesh, {.data_axes = "data"});
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].severity, LintFinding::Severity::Error);
  EXPECT_NE(findings[0].message.find("parameter \"fc1/kernel\" is split over data axis \"data\" "
                                     "(4 devices)"),
            std::string::npos)
      << findings[0].message;
  EXPECT_NE(findings[0].message.find("replicas silently train different models"),
            std::string::npos);
  EXPECT_NE(findings[0].message.find("fully sharded"), std::string::npos);
  // Fully sharded over "data" (ZeRO-3), the same spec is what is meant.
  EXPECT_TRUE(
      lint_sharding(specs, mesh, {.data_axes = "data", .fully_sharded_axes = "data"}).empty());
  const std::string msg = error_of([&] { check_sharding(specs, mesh, {.data_axes = "data"}); });
  EXPECT_NE(msg.find("[check_sharding]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fc1/kernel"), std::string::npos) << msg;
}

TEST(LintSharding, AnAxisWhereDevicesDoTheSameWork) {
  const Mesh mesh({2, 4}, {"data", "model"});
  // Nothing uses "model": 4 devices per data replica compute the same thing.
  const auto findings = lint_sharding({}, mesh, {.data_axes = "data"});
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_NE(findings[0].message.find("mesh axis \"model\" (4 devices) splits neither the batch"),
            std::string::npos)
      << findings[0].message;
  EXPECT_NE(findings[0].message.find("redundant compute"), std::string::npos);
  // Tensor parallelism over "model", sequence-split activations, or the batch over both:
  // no finding.
  EXPECT_TRUE(
      lint_sharding({{"w", P(std::nullopt, "model")}}, mesh, {.data_axes = "data"}).empty());
  EXPECT_TRUE(lint_sharding({}, mesh, {.data_axes = "data", .activation_axes = "model"}).empty());
  EXPECT_TRUE(lint_sharding({}, mesh, {.data_axes = mesh::Axes({"data", "model"})}).empty());
  // An axis of size 1 costs nothing.
  EXPECT_TRUE(lint_sharding({}, Mesh({4, 1}, {"data", "model"}), {.data_axes = "data"}).empty());
}

// A spec naming an axis the mesh lacks (a typo) is an Error naming the parameter, the
// axis and the mesh's axes; the plan's axes must be the mesh's too.
TEST(LintSharding, ASpecNamingAnAxisTheMeshLacks) {
  const Mesh mesh({2, 4}, {"data", "model"});
  const nn::ParamSpecs specs = {{"fc1/kernel", P(std::nullopt, "modle")},
                                {"fc2/kernel", P("model", std::nullopt)}};
  const auto findings = lint_sharding(specs, mesh, {.data_axes = "data"});
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].severity, LintFinding::Severity::Error);
  EXPECT_NE(findings[0].message.find("parameter \"fc1/kernel\""), std::string::npos)
      << findings[0].message;
  EXPECT_NE(findings[0].message.find("names axis \"modle\", not an axis of mesh"),
            std::string::npos)
      << findings[0].message;
  EXPECT_NE(findings[0].message.find("(axes \"data\", \"model\")"), std::string::npos)
      << findings[0].message;
  EXPECT_THROW(check_sharding(specs, mesh, {.data_axes = "data"}), ShardingError);
  EXPECT_ANY_THROW(lint_sharding({}, mesh, {.data_axes = "data", .pipeline_axes = "pipe"}));
}

// A pipeline splits the layers over its axis: no spec names it, and it is not idle.
TEST(LintSharding, APipelineAxisDoesWork) {
  const Mesh mesh({2, 2}, {"data", "pipe"});
  EXPECT_EQ(lint_sharding({}, mesh, {.data_axes = "data"}).size(), 1u);
  EXPECT_TRUE(lint_sharding({}, mesh, {.data_axes = "data", .pipeline_axes = "pipe"}).empty());
}

}  // namespace
}  // namespace distjax::parallel
