// The code snippets of the parallelism and training-system pages of docs/
// (tensor-parallelism.md, zero.md, configs.md, pipeline-parallelism.md, checkpoints.md,
// plan.md, global-view.md), compiled and run with real assertions; see
// docs_snippets_test.cpp for the others.
#include "docs/snippet_util.hpp"

using namespace distjax;
using distjax::testing::contains;
using distjax::testing::error_of;
using mesh::P;

// ------------------------------------------------------------ tensor-parallelism.md

// "Sharded parameters"
TEST(DocsTensorParallelism, ShardedParameters) {
  const TensorTree whole = [] {
    TensorTree t;
    nn::Scope::init(&t, Key::from_seed(0)).param("kernel", {8, 16}, nn::lecun_normal());
    return t;
  }();
  auto f = spmd::shard_map(
      mesh::Mesh({2, 4}, {"data", "model"}),
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        TensorTree params;
        nn::ParamSpecs specs;
        nn::Scope init = nn::Scope::init(&params, Key::from_seed(0), &specs).on(ctx);
        Tensor w = init.param("kernel", {8, 16}, nn::lecun_normal(), P(std::nullopt, "model"));
        EXPECT_EQ(w.shape(), (Shape{8, 4}));
        const int m = ctx.axis_index("model");
        EXPECT_EQ(w.to_vector<float>(),
                  tensor::slice(whole.at("kernel"), 1, 4 * m, 4 * m + 4).to_vector<float>());
        EXPECT_EQ(specs.at("kernel"), P(std::nullopt, "model"));
        EXPECT_EQ(ctx.varying_axes(w), mesh::Axes("model"));
        return std::vector<Tensor>{};
      },
      {}, {});
  f(std::vector<Tensor>{});
}

// "Layers": a Megatron MLP by hand
TEST(DocsTensorParallelism, MegatronMlpByHand) {
  const mesh::Mesh mesh({2}, {"model"});
  const Tensor x = Tensor::ones({4, 8});
  auto f = spmd::shard_map(
      mesh,
      [](spmd::DeviceContext& ctx, const std::vector<Tensor>& in) {
        TensorTree params;
        nn::Scope s = nn::Scope::init(&params, Key::from_seed(0)).on(ctx);
        Tensor h = parallel::ColumnParallelDense{.features = 32}(s.child("fc1"), in[0]);  // (4, 16)
        EXPECT_EQ(h.shape(), (Shape{4, 16}));
        h = tensor::gelu(h);
        Tensor y = parallel::RowParallelDense{.features = 8}(s.child("fc2"), h);  // (4, 8), psum'd
        return std::vector<Tensor>{y};
      },
      {P()}, {P()});
  const Tensor y = mesh::gather(f(std::vector<Tensor>{x})[0]);
  // The same MLP on one device (no context): the same parameters, the same result.
  TensorTree params;
  nn::Scope s = nn::Scope::init(&params, Key::from_seed(0));
  Tensor h = tensor::gelu(parallel::ColumnParallelDense{.features = 32}(s.child("fc1"), x));
  const Tensor want = parallel::RowParallelDense{.features = 8}(s.child("fc2"), h);
  auto a = y.to_vector<float>(), b = want.to_vector<float>();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-5f);
}

// "The transformer layouts"
TEST(DocsTensorParallelism, TrainTheTpGpt) {
  models::Transformer gpt({.vocab = 64,
                           .d_model = 32,
                           .num_layers = 2,
                           .num_heads = 4,
                           .max_len = 16,
                           .tp = {.layout = parallel::TPLayout::Megatron, .vocab_parallel = true}});
  optim::SGD opt({.learning_rate = optim::constant_schedule(0.1)});
  Tensor tokens = Tensor::zeros({4, 16}, DType::I32);
  Tensor targets = Tensor::ones({4, 16}, DType::I32);
  auto f = spmd::shard_map(
      mesh::Mesh({2, 2}, {"data", "model"}),
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        nn::ParamSpecs specs;
        TensorTree shards = gpt.init(Key::from_seed(0), &specs, &ctx);   // this device's shards
        EXPECT_EQ(shards.at("wte/embedding").shape(), (Shape{32, 32}));  // V/2 rows
        train::TrainState state = train::TrainState::create(shards, opt, Key::from_seed(1));
        parallel::DataParallel dp(ctx, "data", &specs);
        train::LossFn loss = [&](const TensorTree& p, const train::Batch& b, Key k) {
          return std::make_pair(gpt.loss(nn::Scope::apply(&p, true, k).on(ctx), b.inputs, b.labels),
                                train::Metrics{});
        };
        const int i = ctx.axis_index("data");
        train::Batch local = train::Batch{tokens, targets}.slice(2 * i, 2 * i + 2);
        const double first =
            train::train_step(state, local, loss, opt, {.max_grad_norm = 1.0, .strategy = &dp})
                .mean("loss");
        const double second =
            train::train_step(state, local, loss, opt, {.max_grad_norm = 1.0, .strategy = &dp})
                .mean("loss");
        EXPECT_LT(second, first);  // one constant target: the loss must fall
        return std::vector<Tensor>{};
      },
      {}, {});
  f(std::vector<Tensor>{});
}

// ------------------------------------------------------------ zero.md

// "ZeRO-1 and ZeRO-2"
TEST(DocsZero, ZeroStrategy) {
  const models::Classifier model(
      {.in_features = 8, .hidden = 16, .num_classes = 4, .dropout = 0.f});
  optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-2)});
  const Key key = Key::from_seed(0), rng = Key::from_seed(1);
  train::LossFn loss_fn = [&](const TensorTree& p, const train::Batch& b, Key k) {
    return std::make_pair(
        tensor::mean(tensor::cross_entropy(model.apply(p, b.inputs, true, k), b.labels)),
        train::Metrics{});
  };
  spmd::shard_map(
      mesh::Mesh({4}, {"data"}),
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        train::Batch local{Tensor::ones({2, 8}), Tensor::zeros({2}, DType::I32)};
        parallel::ZeroDataParallel zero(ctx, /*stage=*/2, "data");
        train::TrainState state = train::TrainState::create(model.init(key), opt, rng, zero);
        EXPECT_EQ(state.opt_state.num_elements(), 2 * model.num_params() / 4);  // mu, nu chunks
        const double first =
            train::train_step(state, local, loss_fn, opt, {.max_grad_norm = 1.0, .strategy = &zero})
                .mean("loss");
        const double second =
            train::train_step(state, local, loss_fn, opt, {.max_grad_norm = 1.0, .strategy = &zero})
                .mean("loss");
        EXPECT_LT(second, first);
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
}

// "ZeRO-3: fully sharded parameters"
TEST(DocsZero, FullyShardedParameters) {
  models::Transformer gpt(
      {.vocab = 64, .d_model = 32, .num_layers = 2, .num_heads = 4, .max_len = 16, .remat = true});
  const Key key = Key::from_seed(0);
  spmd::shard_map(
      mesh::Mesh({8}, {"data"}),
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        const nn::FullySharded fsdp{.axis = "data", .min_weight_size = 1 << 10};
        nn::ParamSpecs specs;
        TensorTree shards = gpt.init(key, &specs, &ctx, &fsdp);  // 1/8 of each large parameter
        EXPECT_EQ(shards.at("blocks/0/mlp/fc1/kernel").numel(), 32 * 128 / 8);
        EXPECT_EQ(specs.at("blocks/0/mlp/fc1/kernel"), P(std::nullopt, "data"));
        parallel::DataParallel dp(ctx, "data", &specs, {.fully_sharded = "data"});
        train::LossFn loss = [&](const TensorTree& p, const train::Batch& b, Key k) {
          nn::Scope s = nn::Scope::apply(&p, true, k).on(ctx).fully_sharded(fsdp);
          return std::make_pair(gpt.loss(s, b.inputs, b.labels), train::Metrics{});
        };
        optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-2)});
        auto state = train::TrainState::create(shards, opt, key, dp);
        train::Batch local{Tensor::zeros({1, 16}, DType::I32), Tensor::ones({1, 16}, DType::I32)};
        const double first =
            train::train_step(state, local, loss, opt, {.strategy = &dp}).mean("loss");
        const double second =
            train::train_step(state, local, loss, opt, {.strategy = &dp}).mean("loss");
        EXPECT_LT(second, first);
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
}

// "Sharding rules, the table and the lint"
TEST(DocsZero, ShardingRulesTableAndLint) {
  const mesh::Mesh mesh({2, 2}, {"data", "model"});
  TensorTree params =
      models::Transformer(
          {.vocab = 32, .d_model = 16, .num_layers = 1, .num_heads = 4, .max_len = 8})
          .init(Key::from_seed(0));
  const parallel::ShardingRules rules({{"(qkv|fc1)/bias$", P("model")},
                                       {"(qkv|fc1)/kernel$", P(std::nullopt, "model")},
                                       {"(out|fc2)/kernel$", P("model", std::nullopt)}});
  nn::ParamSpecs specs = rules.specs_for(params, mesh);  // validated on the mesh
  EXPECT_EQ(specs.at("blocks/0/attn/qkv/kernel"), P(std::nullopt, "model"));
  const std::string table = parallel::sharding_table(parallel::global_shapes(params), specs, mesh);
  EXPECT_NE(table.find("blocks/0/attn/qkv/kernel"), std::string::npos) << table;
  parallel::check_sharding(specs, mesh, {.data_axes = "data"});  // throws on a pitfall
  nn::ParamSpecs bad = specs;
  bad["wte/embedding"] = P("data", std::nullopt);
  const std::string msg =
      error_of<ShardingError>([&] { parallel::check_sharding(bad, mesh, {.data_axes = "data"}); });
  EXPECT_TRUE(contains(msg, "replicas silently train different models")) << msg;
}

// ------------------------------------------------------------ configs.md

// "From C++"
TEST(DocsConfigs, FromCpp) {
  const std::string path = std::string(DISTJAX_SOURCE_DIR) + "/configs/tensor_parallelism.toml";
  config::TrainConfig c =
      config::load_config(path, {"run.steps=10", "distributed.backend=threads"});
  c.distributed = config::resolve(c.distributed, comm::discover_launch_environment());
  c.validate(path);  // ConfigError listing every problem
  mesh::Mesh mesh = config::build_mesh(c.distributed, {"data", "model"});
  EXPECT_EQ(mesh.describe(), "(\"data\"=2, \"model\"=4)");
  EXPECT_EQ(c.distributed.data_parallel_size(), 2);
  EXPECT_EQ(c.run.steps, 10);
}

// docs/pipeline-parallelism.md, "Schedules".
TEST(DocsPipeline, ScheduleAndTimeline) {
  using namespace distjax::parallel;
  PipelineSchedule s = make_schedule(ScheduleKind::OneFOneB, /*stages=*/4, /*microbatches=*/8);
  ScheduleReport r = check_schedule(s);
  const std::string t = format_timeline(s, r);
  EXPECT_EQ(r.peak_in_flight[0], 4);
  EXPECT_NEAR(r.bubble_fraction, 3.0 / 11, 1e-12);
  EXPECT_TRUE(contains(t, "stage 0 |F0 F1 F2 F3 .  .  .  .  .  .  B0 B0 F4 B1 B1 F5")) << t;
  EXPECT_TRUE(contains(t, "stage 1 |.  F0 F1 F2 .  .  .  .  B0 B0 F3 B1 B1 F4")) << t;
  EXPECT_TRUE(contains(schedule_csv(s, r), "stage,index,op,microbatch,chunk,peer,start,end\n"));
}

// docs/pipeline-parallelism.md, "The executor".
TEST(DocsPipeline, Executor) {
  using parallel::ScheduleKind;
  const optim::SGD opt({.learning_rate = optim::constant_schedule(0.1)});
  const Key key = Key::from_seed(0);
  Tensor x = Tensor::full({16, 784}, 0.1), y = Tensor::zeros({16}, DType::I32);
  std::vector<double> losses(4, 0.0);
  spmd::shard_map(mesh::Mesh({2, 2}, {"data", "pipe"}),
                  [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
                    nn::ParamSpecs specs;
                    parallel::DataParallel dp(ctx, "data", &specs);  // the other axes' strategy
                    models::PPClassifier model({.num_layers = 8});
                    parallel::Pipeline pp(
                        ctx, model, {.schedule = ScheduleKind::OneFOneB, .microbatches = 8}, &dp);
                    TensorTree params = model.init(key, pp.chunks(), pp.num_chunks(), &specs, &ctx);
                    auto state = train::TrainState::create(params, opt, key, pp);
                    const train::Batch local_batch{x.view_rows(0, 8), y.view_rows(0, 8)};
                    const train::Metrics m = train::train_step(
                        state, local_batch, /*loss_fn=*/nullptr, opt, {.strategy = &pp});
                    losses[static_cast<std::size_t>(ctx.device())] = m.mean("loss");
                    // Only stage 1 holds the head; stage 0 the input layer.
                    EXPECT_EQ(state.params.contains("head/kernel"), pp.stage() == 1);
                    EXPECT_EQ(state.params.contains("input/kernel"), pp.stage() == 0);
                    return std::vector<Tensor>{};
                  },
                  {}, {})(std::vector<Tensor>{});
  EXPECT_GT(losses[0], 0.0);
  for (double l : losses)
    EXPECT_EQ(l, losses[0]);  // every device reports the same loss
}

// ------------------------------------------------------------ checkpoints.md

// "Saving and loading"
TEST(DocsCheckpoints, SaveOnOneMeshLoadOnAnother) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("distjax_docs_ckpt_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(dir);
  const models::Classifier model(
      {.in_features = 8, .hidden = 16, .num_classes = 4, .dropout = 0.f});
  optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-2)});
  train::LossFn loss_fn = [&](const TensorTree& p, const train::Batch& b, Key k) {
    return std::make_pair(
        tensor::mean(tensor::cross_entropy(model.apply(p, b.inputs, true, k), b.labels)),
        train::Metrics{});
  };
  // Saved on ("data"=4) under ZeRO-2 after one step...
  spmd::shard_map(mesh::Mesh({4}, {"data"}),
                  [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
                    nn::ParamSpecs specs;
                    TensorTree params = model.init(Key::from_seed(0), &specs, &ctx);
                    parallel::ZeroDataParallel zero(ctx, /*stage=*/2, "data", &specs);
                    train::TrainState state =
                        train::TrainState::create(params, opt, Key::from_seed(1), zero);
                    train::train_step(state, {Tensor::ones({2, 8}), Tensor::zeros({2}, DType::I32)},
                                      loss_fn, opt, {.strategy = &zero});
                    train::save_checkpoint(dir, state, {&ctx, &specs, &zero}, {.data = {0, 1}});
                    return std::vector<Tensor>{};
                  },
                  {}, {})(std::vector<Tensor>{});
  // ...loaded on ("data"=2) with plain data parallelism.
  spmd::shard_map(
      mesh::Mesh({2}, {"data"}),
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        nn::ParamSpecs specs;
        TensorTree params = model.init(Key::from_seed(0), &specs, &ctx);
        parallel::DataParallel dp(ctx, "data", &specs);
        train::TrainState state = train::TrainState::create(params, opt, Key::from_seed(1), dp);
        train::CheckpointMeta meta = train::load_checkpoint(dir, state, {&ctx, &specs, &dp});
        EXPECT_EQ(meta.step, 1);  // state.step == 1, state.rng == the saved key
        EXPECT_EQ(state.step, 1);
        EXPECT_EQ(meta.data, (train::DataPosition{0, 1}));
        EXPECT_EQ(state.opt_state.at("mu/fc1/kernel").shape(), (Shape{8, 16}));  // whole slots
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
  // One device reads the global arrays.
  train::TrainState whole = train::TrainState::create(model.init(Key::from_seed(5)), opt, Key{});
  train::load_checkpoint(dir, whole, {});
  EXPECT_EQ(whole.step, 1);
  std::ostringstream os;
  train::inspect_checkpoint(dir, os);
  EXPECT_TRUE(contains(os.str(), "params/fc1/kernel")) << os.str();
  if (std::getenv("DISTJAX_DOCS_PRINT")) std::cout << os.str();
  std::filesystem::remove_all(dir);
}

// "A run that resumes"
TEST(DocsCheckpoints, Checkpointer) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("distjax_docs_ckptr_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  data::ArrayDataset d = data::synthetic_classification(64, 8, 4, Key::from_seed(1));
  optim::Adam opt({.learning_rate = optim::constant_schedule(0.05)});
  train::LossFn loss_fn = [](const TensorTree& p, const train::Batch& b, Key) {
    Tensor loss = tensor::mean(
        tensor::cross_entropy(tensor::linear(b.inputs, p.at("w"), p.at("b")), b.labels));
    return std::make_pair(loss, train::Metrics{});
  };
  auto run = [&](train::Resume resume, std::int64_t steps) {
    TensorTree params;
    params.set("w", Tensor::zeros({8, 4}));
    params.set("b", Tensor::zeros({4}));
    train::TrainState state = train::TrainState::create(params, opt, Key::from_seed(0));
    data::DataLoader loader(d, {.batch_size = 16, .seed = 0});
    train::Checkpointer ckpt({.dir = dir, .every = 4, .keep_last = 2, .resume = resume}, {});
    if (auto pos = ckpt.restore(state)) loader.seek({pos->epoch, pos->batch});
    double loss = 0;
    while (state.step < steps) {
      loss = train::train_step(state, loader.next(), loss_fn, opt).mean("loss");
      auto p = loader.position();
      ckpt.maybe_save(state, {p.epoch, p.batch});
    }
    ckpt.save(state, {loader.position().epoch, loader.position().batch});  // the end
    return loss;
  };
  run(train::Resume::Off, 6);                               // saves step 4 and, at the end, step 6
  const double resumed = run(train::Resume::Required, 10);  // continues from step 6
  std::filesystem::remove_all(dir);
  EXPECT_EQ(resumed, run(train::Resume::Off, 10));  // the same as a run that was never stopped
  std::filesystem::remove_all(dir);
}

// docs/plan.md, "From C++".
TEST(DocsPlan, Gpt3OnSixtyFourDevices) {
  const plan::ModelDescription gpt3 = plan::describe_gpt(50257, 12288, 96, 96, 2048,
                                                         /*vocab_parallel=*/true);
  plan::Setup s{.data = 2,
                .tensor = 8,
                .pipe = 4,
                .sequence_parallel = true,
                .recompute = plan::Recompute::Selective,
                .microbatches = 16,
                .param_bytes = 2,
                .grad_bytes = 2,
                .activation_bytes = 2,
                .state_bytes = 2,
                .global_batch = 32,
                .seq_len = 2048,
                .activations = plan::activation_model_megatron()};
  const plan::Plan p = plan::make_plan(gpt3, s);
  EXPECT_NEAR(p.parameters / 1e9, 11.08, 0.01);
  EXPECT_NEAR(p.total() / 1e9, 54.95, 0.01);
  EXPECT_NE(p.str().find("11.08 GB"), std::string::npos);
  // Only what the program that will run it runs (the gpt program's: no ZeRO-1/2, FSDP).
  const config::ProgramCapabilities runs{.tensor_parallel = true,
                                         .pipeline_parallel = true,
                                         .shards = {config::Shard::None, config::Shard::Parameters},
                                         .mixed_precision = true};
  std::vector<plan::Plan> fits = plan::meshes_that_fit(gpt3, s, 64, 80.0 * (1 << 30), runs);
  EXPECT_FALSE(fits.empty());
  for (const plan::Plan& f : fits)
    EXPECT_EQ(f.setup.zero_stage, 0);
}

// ------------------------------------------------------------ global-view.md

namespace docs_global {

using namespace distjax::global;
using distjax::mesh::Mesh;
using distjax::spmd::DeviceContext;

Tensor randn(const Shape& s, std::uint64_t seed) {
  Tensor t = Tensor::empty(s);
  random_normal(Key::from_seed(seed), t.data<float>(), t.numel());
  return t;
}

TEST(DocsGlobal, ShardingsAndGlobalMap) {
  GlobalSharding rows{P("data", std::nullopt)};
  GlobalSharding pending{P("data", std::nullopt), {"model"}};
  EXPECT_EQ(rows.to_string(), "P(\"data\", None)");
  EXPECT_EQ(pending.to_string(), "P(\"data\", None) partial(\"model\")");

  const Tensor x = randn({8, 16}, 1), w = randn({16, 32}, 2);
  Mesh mesh({2, 4}, {"data", "model"});
  auto f = global::global_map(
      mesh,
      [](DeviceContext&, const std::vector<GlobalArray>& in) {
        GlobalArray h = matmul(in[0], in[1]);  // P("data", "model"): no communication
        EXPECT_EQ(h.sharding().to_string(), "P(\"data\", \"model\")");
        return std::vector<GlobalArray>{h};
      },
      {P("data", std::nullopt), P(std::nullopt, "model")}, {P("data", "model")});
  auto out = f(std::vector<Tensor>{x, w});
  const auto got = mesh::gather(out[0]).to_vector<float>();
  const auto want = tensor::matmul(x, w).to_vector<float>();
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-4);
}

TEST(DocsGlobal, RulesAndReshardPlans) {
  Mesh mesh({2, 4}, {"data", "model"});
  OpRule r = global::matmul_rule({8, 16}, {P(std::nullopt, "model")}, {16, 12},
                                 {P("model", std::nullopt)}, mesh);
  EXPECT_EQ(r.output.to_string(), "P() partial(\"model\")");
  EXPECT_EQ(r.bytes, 0);
  auto a2a = global::plan_redistribution({8, 16}, {P(std::nullopt, "model")},
                                         {P("model", std::nullopt)}, mesh);
  ASSERT_EQ(a2a.size(), 1u);
  EXPECT_EQ(a2a[0].kind, RedistStep::Kind::AllToAll);
  EXPECT_EQ(a2a[0].bytes, 96);
  auto rs = global::plan_redistribution({8, 16}, {P(), {"model"}}, {P("model")}, mesh);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, RedistStep::Kind::ReduceScatter);
}

TEST(DocsGlobal, MegatronBlockPlan) {
  Mesh mesh({2, 4}, {"data", "model"});
  const parallel::ShardingRules rules({{"fc1/kernel$", P(std::nullopt, "model")},
                                       {"fc1/bias$", P("model")},
                                       {"fc2/kernel$", P("model", std::nullopt)}});
  TensorTree init;
  init.set("in/kernel", randn({16, 16}, 3));
  init.set("fc1/kernel", randn({16, 32}, 4));
  init.set("fc1/bias", randn({32}, 5));
  init.set("fc2/kernel", randn({32, 8}, 6));
  init.set("fc2/bias", randn({8}, 7));
  const Tensor xh = randn({16, 16}, 8);
  Tensor yh = Tensor::empty({16}, DType::I32);
  for (int i = 0; i < 16; ++i)
    yh.data<std::int32_t>()[i] = i % 8;
  std::mutex mu;
  std::vector<int> counts;
  std::string printed;
  spmd::shard_map(
      mesh,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        GlobalTree params;
        for (const auto& [path, t] : init)
          params.emplace(path, GlobalArray::from_host(ctx, t, {rules.spec_for(path)}));
        const GlobalArray x = GlobalArray::from_host(ctx, xh, {P("data")});
        const GlobalArray y = GlobalArray::from_host(ctx, yh, {P("data")});
        global::PlanRecorder plan;
        {
          global::RecordPlan on(plan);
          auto [loss, grads] = global::value_and_grad(
              [&](const GlobalTree& p) {
                GlobalArray h = relu(add(matmul(matmul(x, p.at("in/kernel")), p.at("fc1/kernel")),
                                         p.at("fc1/bias")));
                return mean(cross_entropy(add(matmul(h, p.at("fc2/kernel")), p.at("fc2/bias")), y));
              },
              params);
        }
        std::lock_guard<std::mutex> lock(mu);
        counts.push_back(plan.count("all_reduce", "model", PlanEntry::Phase::Forward));
        counts.push_back(plan.count("all_reduce", "model", PlanEntry::Phase::Backward));
        if (ctx.device() == 0) printed = plan.str();
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
  for (int c : counts)
    EXPECT_EQ(c, 1);
  EXPECT_TRUE(
      contains(printed, "forward  add             all_reduce      model                384"))
      << printed;
}

TEST(DocsGlobal, RulesByPathGpt) {
  const models::TransformerConfig cfg{
      .vocab = 32, .d_model = 16, .num_layers = 1, .num_heads = 4, .max_len = 8};
  const TensorTree init = models::Transformer(cfg).init(Key::from_seed(0));
  Tensor tokens = Tensor::empty({4, 8}, DType::I32), targets = Tensor::empty({4, 8}, DType::I32);
  for (int i = 0; i < 32; ++i) {
    tokens.data<std::int32_t>()[i] = (i * 7) % 32;
    targets.data<std::int32_t>()[i] = (i * 3 + 1) % 32;
  }
  const double ref = models::Transformer(cfg)
                         .loss(nn::Scope::apply(&init, false, Key{}), tokens, targets)
                         .item<double>();
  const parallel::ShardingRules rules = models::transformer_megatron_rules("model");
  std::vector<double> losses(8);
  spmd::shard_map(Mesh({2, 4}, {"data", "model"}),
                  [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                    GlobalTree params;
                    for (const auto& [path, t] : init)  // init: models::Transformer(cfg).init(key)
                      params.emplace(path, GlobalArray::from_host(ctx, t, {rules.spec_for(path)}));
                    auto [loss, grads] = global::value_and_grad(
                        [&](const GlobalTree& p) {
                          return models::global_transformer_loss(
                              cfg, p, GlobalArray::from_host(ctx, tokens, {P("data")}),
                              GlobalArray::from_host(ctx, targets, {P("data")}));
                        },
                        params);
                    losses[static_cast<std::size_t>(ctx.device())] = loss.local().item<double>();
                    EXPECT_EQ(grads.at("blocks/0/mlp/fc1/kernel").sharding().to_string(),
                              "P(None, \"model\")");
                    return std::vector<Tensor>{};
                  },
                  {}, {})(std::vector<Tensor>{});
  for (double l : losses)
    EXPECT_NEAR(l, ref, 1e-5 * std::fabs(ref));
}

}  // namespace docs_global
