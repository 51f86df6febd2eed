// Checkpoints: round trip, resharding onto other meshes and strategies, and exact
// resumption (also after SIGKILL, and after a kill in the middle of a save). Broken files
// and Python's safetensors: checkpoint_errors_test.cpp.
#include "train/checkpoint_test_util.hpp"

namespace distjax::train {
namespace {

using namespace checkpoint_testing;
namespace fs = std::filesystem;
using json = nlohmann::json;
using mesh::Mesh;
using spmd::DeviceContext;
using tensor::Tensor;
TEST(Checkpoint, OneDeviceRoundTrip) {
  const std::string dir = scratch("roundtrip");
  Small s;
  TrainState a = s.trained();
  a.rng = Key{{123u, 456u}};
  const std::string step_dir =
      save_checkpoint(dir, a, {}, {.data = {2, 5}, .config = R"({"lr": 0.01, "name": "x"})"});
  EXPECT_EQ(step_dir, (fs::path(dir) / "step_00000003").string());
  EXPECT_TRUE(fs::exists(fs::path(step_dir) / "index.json"));
  EXPECT_TRUE(fs::exists(fs::path(step_dir) / "device_00000.safetensors"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "step_00000003.tmp"));
  std::ifstream latest(fs::path(dir) / "latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_00000003");

  TrainState b = s.fresh(/*seed=*/9);
  const CheckpointMeta meta = load_checkpoint(dir, b, {});
  EXPECT_EQ(meta.path, step_dir);
  EXPECT_EQ(b.step, 3);
  EXPECT_EQ(b.rng, a.rng);
  EXPECT_EQ(meta.data, (DataPosition{2, 5}));
  EXPECT_EQ(json::parse(meta.config), json::parse(R"({"lr": 0.01, "name": "x"})"));
  expect_bitwise_equal(a.params, b.params, "params");
  expect_bitwise_equal(a.opt_state, b.opt_state, "opt_state");
  // The load really replaced the values (a fresh state of another seed differs).
  EXPECT_NE(s.fresh(9).params.at("fc1/kernel").to_vector<float>(),
            b.params.at("fc1/kernel").to_vector<float>());
}

TEST(Checkpoint, LossScaleRoundTrip) {
  // An f16 run's dynamic loss scale is saved in the index and restored; a checkpoint
  // without one leaves the state's own.
  const std::string dir = scratch("loss_scale");
  Small s;
  TrainState a = s.trained();
  a.loss_scale =
      DynamicLossScale{.scale = 512, .growth_interval = 7, .good_steps = 3, .skipped_steps = 4};
  save_checkpoint(dir, a, {});
  TrainState b = s.fresh(/*seed=*/9);
  const CheckpointMeta meta = load_checkpoint(dir, b, {});
  ASSERT_TRUE(b.loss_scale.has_value());
  EXPECT_EQ(*b.loss_scale, *a.loss_scale);
  EXPECT_EQ(meta.loss_scale, a.loss_scale);
  std::ostringstream os;
  inspect_checkpoint(dir, os);
  EXPECT_NE(os.str().find("loss scale 512 (3 good steps, 4 skipped)"), std::string::npos)
      << os.str();

  const std::string plain = scratch("no_loss_scale");
  save_checkpoint(plain, s.trained(), {});
  TrainState c = s.fresh(9);
  c.loss_scale = DynamicLossScale{.scale = 64};
  EXPECT_FALSE(load_checkpoint(plain, c, {}).loss_scale.has_value());
  EXPECT_EQ(c.loss_scale->scale, 64);
}

// Every dtype and a scalar, saved split over a mesh and read back on one device.
TEST(Checkpoint, EveryDtypeAndScalars) {
  auto values = [](DType t, const Shape& shape, std::int64_t begin) {
    std::vector<float> v(static_cast<std::size_t>(numel(shape)));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = 0.25f * static_cast<float>(begin + static_cast<std::int64_t>(i)) - 3.f;
    return tensor::astype(Tensor::from_vector<float>(v, shape), t);
  };
  auto state_of = [&](int part, int parts) {
    TrainState s;
    s.step = 1;
    const std::int64_t rows = 8 / parts;
    s.params.set("bf16", values(DType::BF16, {rows, 3}, part * rows * 3));
    s.params.set("f16", values(DType::F16, {rows}, part * rows));
    s.params.set("i32", values(DType::I32, {rows, 2}, part * rows * 2));
    s.params.set("i64", values(DType::I64, {5}, 0));
    s.params.set("scalar", Tensor::scalar(2.5));
    return s;
  };
  const std::string dir = scratch("dtypes");
  on_mesh(Mesh({2}, {"x"}), [&](DeviceContext& ctx) {
    const nn::ParamSpecs specs{
        {"bf16", mesh::P("x")}, {"f16", mesh::P("x")}, {"i32", mesh::P("x")}};
    save_checkpoint(dir, state_of(ctx.device(), 2), {&ctx, &specs, nullptr});
  });
  const TrainState ref = state_of(0, 1);
  TrainState back = ref;
  back.params = zeros_like(ref.params);
  load_checkpoint(dir, back, {});
  expect_bitwise_equal(ref.params, back.params, "params");
  // The index is JSON with one line per tensor.
  const std::string text = [&] {
    std::ifstream f(fs::path(*find_checkpoint(dir)) / "index.json");
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }();
  EXPECT_TRUE(json::accept(text));
  EXPECT_NE(text.find("\n  \"params/bf16\": {\"shape\":[8,3],\"dtype\":\"bf16\""),
            std::string::npos)
      << text;
}

TEST(Checkpoint, InspectPrintsTheIndex) {
  const std::string dir = scratch("inspect");
  Small s;
  save_checkpoint(dir, s.trained(), {});
  std::ostringstream os;
  inspect_checkpoint(dir, os);
  const std::string text = os.str();
  EXPECT_NE(text.find("step 3"), std::string::npos) << text;
  EXPECT_NE(text.find("(one device)"), std::string::npos) << text;
  EXPECT_NE(text.find("params/fc1/kernel"), std::string::npos) << text;
  EXPECT_NE(text.find("opt_state/mu/fc1/kernel"), std::string::npos) << text;
  EXPECT_NE(text.find("(6, 8)"), std::string::npos) << text;
  EXPECT_NE(text.find("device_00000.safetensors"), std::string::npos) << text;
}

TEST(Checkpoint, KeepLastPrunesOlderSteps) {
  const std::string dir = scratch("keep");
  Small s;
  TrainState a = s.fresh();
  for (int step : {1, 2, 3, 4}) {
    a.step = step;
    save_checkpoint(dir, a, {}, {.keep_last = 2});
  }
  EXPECT_FALSE(fs::exists(fs::path(dir) / "step_00000002"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step_00000003"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step_00000004"));
  // Saving a step again replaces it.
  save_checkpoint(dir, a, {}, {.keep_last = 2});
  EXPECT_EQ(*find_checkpoint(dir), (fs::path(dir) / "step_00000004").string());
}

// ------------------------------------------------------------ resharding

// The GPT with Megatron tensor parallelism (vocabulary parallel too) over "model", data
// parallel over every other mesh axis.
TEST(CheckpointReshard, SavedOn2x2x2LoadsOn1x8And4x2x1) {
  const GptRun run;
  const std::string saved = scratch("reshard_a");
  const Mesh a({2, 2, 2}, {"data", "model", "replica"});
  // Saved under ZeRO-1 (optimizer state in chunks over data x replica) after 3 steps.
  const double next_a = gpt_on_mesh(run, a, Kind::Zero1, "", 3, saved, 3);
  const TrainState ref = load_whole(run, saved);
  EXPECT_EQ(ref.step, 3);
  EXPECT_EQ(ref.opt_state.size(), 2 * ref.params.size());  // mu and nu of every parameter

  struct Target {
    Mesh mesh;
    Kind kind;
  };
  for (const Target& t : {Target{Mesh({1, 8}, {"data", "model"}), Kind::DataParallel},
                          Target{Mesh({4, 2, 1}, {"data", "model", "replica"}), Kind::Zero2},
                          Target{Mesh({8, 1}, {"data", "model"}), Kind::DataParallel}}) {
    SCOPED_TRACE(t.mesh.describe());
    const std::string again = scratch("reshard_b");
    // Loaded, saved again at once from the new layout, and trained one step.
    const double next = gpt_on_mesh(run, t.mesh, t.kind, saved, 0, again, 3);
    const TrainState back = load_whole(run, again);
    // Every parameter and every optimizer slot went through the new layout unchanged.
    expect_bitwise_equal(ref.params, back.params, "params");
    expect_bitwise_equal(ref.opt_state, back.opt_state, "opt_state");
    EXPECT_EQ(back.step, 3);
    // The same next-step loss (the reduction order of the sharded matmuls differs).
    EXPECT_NEAR(next, next_a, 1e-5 * std::abs(next_a));
  }
}

TEST(CheckpointReshard, EachDistinctBlockIsWrittenOnce) {
  const GptRun run;
  const std::string dir = scratch("dedup");
  gpt_on_mesh(run, Mesh({2, 2, 2}, {"data", "model", "replica"}), Kind::DataParallel, "", 1, dir,
              1);
  const CheckpointIndex index = read_checkpoint_index(dir);
  EXPECT_EQ(index.mesh_shape, (std::vector<int>{2, 2, 2}));
  // Only the devices with data = replica = 0 write: 0 and 2 (model 0 and 1).
  EXPECT_EQ(index.files,
            (std::vector<std::string>{"device_00000.safetensors", "device_00002.safetensors"}));
  for (const CheckpointTensor& t : index.tensors) {
    const bool sharded = t.spec.uses("model");
    EXPECT_EQ(t.blocks.size(), sharded ? 2u : 1u) << t.name;
    std::int64_t elements = 0;
    for (const auto& b : t.blocks)
      elements += numel(b.shape);
    EXPECT_EQ(elements, numel(t.shape)) << t.name;
  }
  const auto it = std::find_if(index.tensors.begin(), index.tensors.end(),
                               [](const auto& t) { return t.name == "params/wte/embedding"; });
  ASSERT_NE(it, index.tensors.end());
  EXPECT_EQ(it->spec, mesh::P("model", std::nullopt));
  EXPECT_EQ(it->blocks[1].offset, (Shape{16, 0}));
  EXPECT_EQ(it->blocks[1].file, "device_00002.safetensors");
  std::ostringstream os;
  inspect_checkpoint(dir, os);
  EXPECT_NE(os.str().find("mesh (\"data\"=2, \"model\"=2, \"replica\"=2), 2 files"),
            std::string::npos)
      << os.str();
  EXPECT_NE(os.str().find("P(\"model\", None)  2 in device_00000.safetensors, "
                          "device_00002.safetensors"),
            std::string::npos)
      << os.str();
  if (std::getenv("DISTJAX_TEST_PRINT")) std::cout << os.str();
}

// A pipeline (2 stages over "pipe", each holding its own blocks) with tensor parallelism
// inside the stages and ZeRO-1 over "data": its checkpoint holds the whole model's paths,
// so it loads into the plain model on other meshes, and into another pipeline.
models::TransformerConfig pipe_gpt_config() {
  models::TransformerConfig c = gpt_config();
  c.num_layers = 4;
  c.tied_embeddings = false;  // the head and the embedding are on different stages
  c.tp.vocab_parallel = false;
  return c;
}

// Trains (or loads) a pipeline on `mesh` ("data", "model", "pipe"); saves into `save_to`
// when given; returns the loss of one more step on `next`.
double pipeline_on_mesh(const Mesh& mesh, Kind kind, const std::string& load_from, int steps,
                        const std::string& save_to, int next) {
  const GptRun run;
  const models::TransformerPipeline module(pipe_gpt_config());
  std::vector<double> loss(static_cast<std::size_t>(mesh.size()));
  on_mesh(mesh, [&](DeviceContext& ctx) {
    const int p = ctx.axis_size("pipe");
    nn::ParamSpecs specs;
    TensorTree params = module.init(Key::from_seed(1), {ctx.axis_index("pipe")}, p, &specs, &ctx);
    auto inner = make_strategy(kind, ctx, "data", specs);
    parallel::Pipeline pp(ctx, module,
                          {.schedule = parallel::ScheduleKind::OneFOneB, .microbatches = 2},
                          inner.get());
    TrainState state = TrainState::create(params, run.opt, Key::from_seed(2), pp);
    const CheckpointLayout layout{&ctx, &specs, &pp};
    const int n = ctx.axis_size("data"), i = ctx.axis_index("data");
    auto local = [&](const Batch& b) {
      const std::int64_t per = b.size() / n;
      return b.slice(i * per, (i + 1) * per);
    };
    if (!load_from.empty()) load_checkpoint(load_from, state, layout);
    for (int s = 0; s < steps; ++s)
      train_step(state, local(run.batches[static_cast<std::size_t>(s)]), nullptr, run.opt,
                 {.strategy = &pp});
    if (!save_to.empty()) save_checkpoint(save_to, state, layout);
    const Metrics m = train_step(state, local(run.batches[static_cast<std::size_t>(next)]), nullptr,
                                 run.opt, {.strategy = &pp});
    loss[static_cast<std::size_t>(ctx.device())] = m.mean("loss");
  });
  return loss[0];
}

TEST(CheckpointReshard, PipelineSavedOn2x2x2LoadsWithoutAndWithPipes) {
  const std::string saved = scratch("pipe_a");
  const Mesh a({2, 2, 2}, {"data", "model", "pipe"});
  const double next_a = pipeline_on_mesh(a, Kind::Zero1, "", 2, saved, 2);
  const CheckpointIndex index = read_checkpoint_index(saved);
  // Stage 1 (pipe coordinate 1: devices 1, 3, 5, 7) holds the later blocks and the head;
  // the lowest of those holding each block writes it.
  auto tensor = [&](const std::string& name) {
    const auto it = std::find_if(index.tensors.begin(), index.tensors.end(),
                                 [&](const auto& t) { return t.name == name; });
    EXPECT_NE(it, index.tensors.end()) << name;
    return it == index.tensors.end() ? CheckpointTensor{} : *it;
  };
  const CheckpointTensor head = tensor("params/lm_head/kernel");
  ASSERT_EQ(head.blocks.size(), 1u);
  EXPECT_EQ(head.blocks[0].file, "device_00001.safetensors");
  const CheckpointTensor qkv = tensor("params/blocks/3/attn/qkv/kernel");
  ASSERT_EQ(qkv.blocks.size(), 2u);
  EXPECT_EQ(qkv.blocks[0].file, "device_00001.safetensors");
  EXPECT_EQ(qkv.blocks[1].file, "device_00003.safetensors");
  const CheckpointTensor wte = tensor("params/wte/embedding");
  ASSERT_EQ(wte.blocks.size(), 1u);
  EXPECT_EQ(wte.blocks[0].file, "device_00000.safetensors");

  // The whole model's arrays, on one device.
  GptRun plain_run;
  const models::Transformer plain(pipe_gpt_config());
  auto whole = [&](const std::string& d) {
    TrainState s = TrainState::create(plain.init(Key::from_seed(4)), plain_run.opt, Key{});
    load_checkpoint(d, s, {});
    return s;
  };
  const TrainState ref = whole(saved);
  EXPECT_EQ(ref.opt_state.size(), 2 * ref.params.size());

  // Into a pipeline of another shape: ("data"=4, "model"=1, "pipe"=2), plain data parallel.
  const std::string again = scratch("pipe_b");
  const double next_b = pipeline_on_mesh(Mesh({4, 1, 2}, {"data", "model", "pipe"}),
                                         Kind::DataParallel, saved, 0, again, 2);
  const TrainState back = whole(again);
  expect_bitwise_equal(ref.params, back.params, "params via (4, 1, 2)");
  expect_bitwise_equal(ref.opt_state, back.opt_state, "opt_state via (4, 1, 2)");
  EXPECT_NEAR(next_b, next_a, 1e-5 * std::abs(next_a));

  // Into the plain model, tensor parallel on (1, 8).
  plain_run.model = plain;
  const std::string flat = scratch("pipe_c");
  const double next_c = gpt_on_mesh(plain_run, Mesh({1, 8}, {"data", "model"}), Kind::DataParallel,
                                    saved, 0, flat, 2);
  const TrainState back_c = whole(flat);
  expect_bitwise_equal(ref.params, back_c.params, "params via (1, 8)");
  expect_bitwise_equal(ref.opt_state, back_c.opt_state, "opt_state via (1, 8)");
  EXPECT_NEAR(next_c, next_a, 1e-5 * std::abs(next_a));
}

// ------------------------------------------------------------ resuming

const models::Classifier& resume_model() {
  static const models::Classifier model(
      {.in_features = 10, .hidden = 16, .num_classes = 3, .dropout = 0.2f});
  return model;
}

const optim::AdamW& resume_opt() {
  static const optim::AdamW opt({.learning_rate = optim::warmup_cosine_schedule(0.0, 0.01, 3, 60)});
  return opt;
}

// A data-parallel run on ("data"=2) with fully sharded parameters (FSDP over "data"),
// dropout (the key matters), AdamW with warmup and cosine decay (the step matters) and a
// shuffling loader split over the replicas (its position matters), checkpointed by a
// Checkpointer. Returns the loss of every step it ran, by step. A resumed run starts from
// other initial parameters and key (`seed`): it must take both from the checkpoint.
std::map<std::int64_t, double> run_with_checkpoints(
    const CheckpointConfig& config, std::int64_t until,
    const std::function<void(std::int64_t, double)>& on_step = nullptr) {
  const std::uint64_t seed = config.resume != Resume::Off ? 50 : 1;
  const models::Classifier& model = resume_model();
  const optim::AdamW& opt = resume_opt();
  const data::ArrayDataset data = data::synthetic_classification(40, 10, 3, Key::from_seed(5));
  const nn::FullySharded fsdp{.axis = "data", .min_weight_size = 32};
  std::map<std::int64_t, double> losses;
  on_mesh(Mesh({2}, {"data"}), [&](DeviceContext& ctx) {
    nn::ParamSpecs specs;
    TensorTree params = model.init(Key::from_seed(seed), &specs, &ctx, &fsdp);
    parallel::DataParallel dp(ctx, "data", &specs, {.fully_sharded = "data"});
    TrainState state = TrainState::create(params, opt, Key::from_seed(seed + 1), dp);
    data::DataLoader loader(
        data, {.batch_size = 8, .seed = 3, .num_shards = 2, .shard_index = ctx.axis_index("data")});
    Checkpointer ckpt(config, {&ctx, &specs, &dp});
    if (auto pos = ckpt.restore(state)) loader.seek({pos->epoch, pos->batch});
    const LossFn fn = [&](const TensorTree& p, const Batch& b, Key k) {
      const nn::Scope scope = nn::Scope::apply(&p, /*train=*/true, k).on(ctx).fully_sharded(fsdp);
      return std::make_pair(tensor::mean(tensor::cross_entropy(model(scope, b.inputs), b.labels)),
                            Metrics{});
    };
    auto position = [&] { return DataPosition{loader.position().epoch, loader.position().batch}; };
    while (state.step < until) {
      const Metrics m = train_step(state, loader.next(), fn, opt, {.strategy = &dp});
      if (ctx.device() == 0) {
        losses[state.step] = m.mean("loss");
        if (on_step) on_step(state.step, m.mean("loss"));
      }
      ckpt.maybe_save(state, position());
    }
    ckpt.save(state, position());
  });
  return losses;
}

TEST(CheckpointResume, ResumedRunMatchesUninterrupted) {
  const auto whole = run_with_checkpoints({}, 14);
  const std::string dir = scratch("resume");
  // Interrupted after step 8; checkpoints at 3, 6 and (at the end) 8.
  const auto first = run_with_checkpoints({.dir = dir, .every = 3}, 8);
  EXPECT_EQ(*find_checkpoint(dir), (fs::path(dir) / "step_00000008").string());
  fs::remove_all(fs::path(dir) / "step_00000008");  // as if killed between 6 and 8
  const auto second =
      run_with_checkpoints({.dir = dir, .every = 3, .resume = Resume::Required}, 14);
  ASSERT_EQ(second.begin()->first, 7);  // resumed from step 6
  for (const auto& [step, loss] : second)
    EXPECT_EQ(loss, whole.at(step)) << "step " << step;
  for (const auto& [step, loss] : first)
    EXPECT_EQ(loss, whole.at(step)) << "step " << step;
  // The data position is saved: after 6 steps of 8 from 40 examples (5 batches an
  // epoch), epoch 1, batch 1.
  const std::string other = scratch("resume_other");
  run_with_checkpoints({.dir = other, .every = 6}, 6);
  const CheckpointIndex index = read_checkpoint_index(other);
  EXPECT_EQ(index.meta.step, 6);
  EXPECT_EQ(index.meta.data, (DataPosition{1, 1}));
}

TEST(CheckpointReshard, FullyShardedLoadsReplicatedAndOnOneDevice) {
  // Saved with the parameters fully sharded over ("data"=2)...
  const std::string dir = scratch("fsdp");
  run_with_checkpoints({.dir = dir, .every = 6}, 6);
  const CheckpointIndex index = read_checkpoint_index(dir);
  const auto kernel = std::find_if(index.tensors.begin(), index.tensors.end(),
                                   [](const auto& t) { return t.name == "params/fc1/kernel"; });
  ASSERT_NE(kernel, index.tensors.end());
  EXPECT_TRUE(kernel->spec.uses("data")) << kernel->spec.to_string();
  EXPECT_EQ(kernel->blocks.size(), 2u);
  // ...loaded replicated on ("data"=4) and saved again: the same arrays.
  const std::string again = scratch("fsdp_again");
  on_mesh(Mesh({4}, {"data"}), [&](DeviceContext& ctx) {
    nn::ParamSpecs specs;
    TensorTree params = resume_model().init(Key::from_seed(9), &specs, &ctx);
    parallel::DataParallel dp(ctx, "data", &specs);
    TrainState state = TrainState::create(params, resume_opt(), Key{}, dp);
    load_checkpoint(dir, state, {&ctx, &specs, &dp});
    EXPECT_EQ(state.params.at("fc1/kernel").shape(), (Shape{10, 16}));
    save_checkpoint(again, state, {&ctx, &specs, &dp});
  });
  auto whole = [&](const std::string& d) {
    TrainState s = TrainState::create(resume_model().init(Key::from_seed(3)), resume_opt(), Key{});
    load_checkpoint(d, s, {});
    return s;
  };
  const TrainState a = whole(dir), b = whole(again);
  expect_bitwise_equal(a.params, b.params, "params");
  expect_bitwise_equal(a.opt_state, b.opt_state, "opt_state");
  EXPECT_EQ(a.step, 6);
  EXPECT_EQ(a.rng, b.rng);
}

// ------------------------------------------------------------ killed runs (child processes)

// The training process the kill tests start: this test binary again, running only
// CheckpointChild.Train with DISTJAX_CKPT_CHILD_DIR set. It trains up to 4000 steps,
// checkpointing every 5, appends "step loss" lines to DIR/losses.txt, and with
// DISTJAX_CKPT_CHILD_CRASH=<stage>@<step> kills itself (SIGKILL) when the save of that step
// reaches that stage; else it sleeps 30 ms per step until the parent kills it.
TEST(CheckpointChild, Train) {
  const char* dir = std::getenv("DISTJAX_CKPT_CHILD_DIR");
  if (dir == nullptr) GTEST_SKIP() << "only runs as the child process of the kill tests";
  const char* crash = std::getenv("DISTJAX_CKPT_CHILD_CRASH");
  std::string stage;
  std::int64_t crash_step = -1;
  if (crash != nullptr) {
    const std::string c = crash;
    stage = c.substr(0, c.find('@'));
    crash_step = std::stoll(c.substr(c.find('@') + 1));
  }
  std::FILE* log = std::fopen((fs::path(dir) / "losses.txt").c_str(), "a");
  ASSERT_NE(log, nullptr);
  std::int64_t current = 0;
  CheckpointConfig config{.dir = (fs::path(dir) / "ckpt").string(), .every = 5};
  config.fault_hook = [&](const std::string& s) {
    if (s == stage && current == crash_step) ::raise(SIGKILL);
  };
  run_with_checkpoints(config, 4000, [&](std::int64_t step, double loss) {
    std::fprintf(log, "%lld %.17g\n", static_cast<long long>(step), loss);
    std::fflush(log);
    current = step;
    if (crash == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(30));
  });
}

// Starts the child; returns its pid.
pid_t start_child(const std::string& dir, const std::string& crash) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("DISTJAX_CKPT_CHILD_DIR", dir.c_str(), 1);
    if (!crash.empty()) ::setenv("DISTJAX_CKPT_CHILD_CRASH", crash.c_str(), 1);
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::execl("/proc/self/exe", "checkpoint_test", "--gtest_filter=CheckpointChild.Train",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

std::map<std::int64_t, double> read_losses(const std::string& dir) {
  std::map<std::int64_t, double> out;
  std::ifstream f(fs::path(dir) / "losses.txt");
  std::int64_t step;
  double loss;
  while (f >> step >> loss)
    out[step] = loss;
  return out;
}

const std::map<std::int64_t, double>& uninterrupted_60() {
  static const auto losses = run_with_checkpoints({}, 60);
  return losses;
}

TEST(CheckpointResume, KilledWithSigkillResumesExactly) {
  const std::string dir = scratch("sigkill");
  const std::string ckpt = (fs::path(dir) / "ckpt").string();
  const auto& whole = uninterrupted_60();
  const pid_t pid = start_child(dir, "");
  ASSERT_GT(pid, 0);
  // Kill it once it has saved step 10 or later (or stop waiting if it ended by itself).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::int64_t saved = -1;
  int status = 0;
  bool ended = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto c = find_checkpoint(ckpt)) saved = read_checkpoint_index(*c).meta.step;
    if (saved >= 10) break;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      ended = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!ended) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  ASSERT_GE(saved, 10) << "the child saved no checkpoint in time (ended by itself: " << ended
                       << ", status " << status << ")";
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

  const auto before = read_losses(dir);
  const std::int64_t resumed_from = read_checkpoint_index(ckpt).meta.step;
  ASSERT_LT(resumed_from, 60);
  ASSERT_GE(before.rbegin()->first, resumed_from);
  for (const auto& [step, loss] : before)
    if (step <= 60) {
      EXPECT_EQ(loss, whole.at(step)) << "child, step " << step;
    }
  const auto after =
      run_with_checkpoints({.dir = ckpt, .every = 5, .resume = Resume::Required}, 60);
  ASSERT_EQ(after.begin()->first, resumed_from + 1);
  ASSERT_EQ(after.rbegin()->first, 60);
  for (const auto& [step, loss] : after)
    EXPECT_EQ(loss, whole.at(step)) << "resumed, step " << step;
}

// A kill in the middle of the save of step 10, at each stage: the checkpoint of step 5 (or
// the complete one of step 10) is loadable and the run resumes exactly.
TEST(CheckpointResume, KillDuringSaveLeavesTheLastCheckpointLoadable) {
  const auto& whole = uninterrupted_60();
  for (const std::string stage : {"shards_written", "index_written", "renamed"}) {
    SCOPED_TRACE(stage);
    const std::string dir = scratch("crash_" + stage);
    const std::string ckpt = (fs::path(dir) / "ckpt").string();
    const pid_t pid = start_child(dir, stage + "@10");
    ASSERT_GT(pid, 0);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
    const bool complete = stage == "renamed";
    EXPECT_EQ(fs::exists(fs::path(ckpt) / "step_00000010.tmp"), !complete);
    EXPECT_EQ(fs::exists(fs::path(ckpt) / "step_00000010"), complete);
    std::ifstream latest(fs::path(ckpt) / "latest");
    std::string name;
    latest >> name;
    EXPECT_EQ(name, "step_00000005");  // `latest` is updated last
    const std::int64_t expect = complete ? 10 : 5;
    EXPECT_EQ(read_checkpoint_index(ckpt).meta.step, expect);
    const auto after =
        run_with_checkpoints({.dir = ckpt, .every = 5, .resume = Resume::Required}, 20);
    ASSERT_EQ(after.begin()->first, expect + 1);
    for (const auto& [step, loss] : after)
      EXPECT_EQ(loss, whole.at(step)) << "resumed, step " << step;
    // The save of step 10 went through this time, over the leftover temporary directory.
    EXPECT_FALSE(fs::exists(fs::path(ckpt) / "step_00000010.tmp"));
    EXPECT_TRUE(fs::exists(fs::path(ckpt) / "step_00000010" / "index.json"));
  }
}

// ------------------------------------------------------------ broken files

// docs/checkpoints.md's example across meshes: saved on ("data"=4) under ZeRO-2 after one
// step, loaded on ("data"=2) under plain data parallelism (whole optimizer slots), and by one
// device with no mesh.
TEST(Checkpoint, SavedUnderZero2OnFourLoadsUnderDataParallelOnTwo) {
  const std::string dir = scratch("zero2_to_dp");
  const models::Classifier model({.in_features = 8, .hidden = 16, .num_classes = 4, .dropout = 0.f});
  optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-2)});
  LossFn loss_fn = [&](const TensorTree& p, const Batch& b, Key k) {
    return std::make_pair(
        tensor::mean(tensor::cross_entropy(model.apply(p, b.inputs, true, k), b.labels)),
        Metrics{});
  };
  on_mesh(Mesh({4}, {"data"}), [&](DeviceContext& ctx) {
    nn::ParamSpecs specs;
    TensorTree params = model.init(Key::from_seed(0), &specs, &ctx);
    parallel::ZeroDataParallel zero(ctx, /*stage=*/2, "data", &specs);
    TrainState state = TrainState::create(params, opt, Key::from_seed(1), zero);
    train_step(state, {Tensor::ones({2, 8}), Tensor::zeros({2}, DType::I32)}, loss_fn, opt,
               {.strategy = &zero});
    save_checkpoint(dir, state, {&ctx, &specs, &zero}, {.data = {0, 1}});
  });
  on_mesh(Mesh({2}, {"data"}), [&](DeviceContext& ctx) {
    nn::ParamSpecs specs;
    TensorTree params = model.init(Key::from_seed(0), &specs, &ctx);
    parallel::DataParallel dp(ctx, "data", &specs);
    TrainState state = TrainState::create(params, opt, Key::from_seed(1), dp);
    const CheckpointMeta meta = load_checkpoint(dir, state, {&ctx, &specs, &dp});
    EXPECT_EQ(meta.step, 1);
    EXPECT_EQ(state.step, 1);
    EXPECT_EQ(meta.data, (DataPosition{0, 1}));
    EXPECT_EQ(state.opt_state.at("mu/fc1/kernel").shape(), (Shape{8, 16}));  // whole slots
  });
  TrainState whole = TrainState::create(model.init(Key::from_seed(5)), opt, Key{});
  load_checkpoint(dir, whole, {});
  EXPECT_EQ(whole.step, 1);
  std::ostringstream os;
  inspect_checkpoint(dir, os);
  EXPECT_NE(os.str().find("params/fc1/kernel"), std::string::npos) << os.str();
}

}  // namespace
}  // namespace distjax::train
