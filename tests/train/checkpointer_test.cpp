// The Checkpointer's restore never guesses: a fresh run refuses a directory that holds
// checkpoints (or removes them with overwrite), a required resume without a checkpoint
// says where it looked, an automatic one starts fresh; drop lets chosen tensors of the
// checkpoint go unloaded.
#include "train/checkpoint_test_util.hpp"

namespace distjax::train {
namespace {

using namespace checkpoint_testing;
namespace fs = std::filesystem;
using mesh::Mesh;
using spmd::DeviceContext;

// A checkpoint directory holding Small's trained state (step 3) and a file of the user's.
std::string dir_with_checkpoint(const std::string& name) {
  const std::string dir = scratch(name);
  Checkpointer(CheckpointConfig{.dir = dir}, {}).save(Small().trained(), {1, 2});
  std::ofstream(fs::path(dir) / "notes.txt") << "kept\n";
  return dir;
}

std::string restore_error(const CheckpointConfig& config) {
  TrainState state = Small().fresh();
  try {
    Checkpointer(config, {}).restore(state);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Checkpointer, AFreshRunRefusesADirectoryWithCheckpoints) {
  const std::string dir = dir_with_checkpoint("fresh_refused");
  const std::string msg = restore_error({.dir = dir});
  EXPECT_NE(msg.find("[Checkpointer] \"" + dir +
                     "\" holds checkpoints up to step 3: pass --resume "
                     "to continue, --resume=auto, or --overwrite to start afresh"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg, [&] {  // check_restore says the same, without a Checkpointer
    try {
      check_restore({.dir = dir});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  }());
  EXPECT_TRUE(find_checkpoint(dir).has_value()) << "a refusal must leave the checkpoints";
}

TEST(Checkpointer, OverwriteRemovesTheCheckpointsOnEveryDevice) {
  const std::string dir = dir_with_checkpoint("overwrite");
  fs::create_directories(fs::path(dir) / "step_00000009.tmp");  // a crashed save's leftover
  on_mesh(Mesh({2}, {"data"}), [&](DeviceContext& ctx) {
    TrainState state = Small().fresh();
    Checkpointer ckpt({.dir = dir, .overwrite = true}, {&ctx, nullptr, nullptr});
    EXPECT_FALSE(ckpt.restore(state).has_value());
    EXPECT_EQ(state.step, 0);
  });
  EXPECT_FALSE(find_checkpoint(dir).has_value());
  EXPECT_FALSE(fs::exists(fs::path(dir) / "step_00000003"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "step_00000009.tmp"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "latest"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "notes.txt")) << "only checkpoints are removed";
}

TEST(Checkpointer, ARequiredResumeWithoutACheckpointSaysWhereItLooked) {
  const std::string missing = (fs::path(scratch("required")) / "nothing").string();
  EXPECT_NE(restore_error({.dir = missing, .resume = Resume::Required})
                .find("[Checkpointer] no checkpoint to resume from in \"" + missing +
                      "\": the directory does not exist"),
            std::string::npos)
      << restore_error({.dir = missing, .resume = Resume::Required});
  // A step directory whose index.json is gone is named.
  const std::string dir = dir_with_checkpoint("required_no_index");
  fs::remove(fs::path(dir) / "step_00000003" / "index.json");
  const std::string msg = restore_error({.dir = dir, .resume = Resume::Required});
  EXPECT_NE(msg.find("no checkpoint to resume from in \"" + dir + "\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("step_00000003 has no index.json"), std::string::npos) << msg;
  // Auto starts afresh in both.
  EXPECT_EQ(restore_error({.dir = missing, .resume = Resume::Auto}), "no error");
  EXPECT_EQ(restore_error({.dir = dir, .resume = Resume::Auto}), "no error");
}

TEST(Checkpointer, AutoAndRequiredResume) {
  const std::string dir = dir_with_checkpoint("auto");
  for (const Resume r : {Resume::Auto, Resume::Required}) {
    TrainState state = Small().fresh();
    const auto pos = Checkpointer({.dir = dir, .resume = r}, {}).restore(state);
    ASSERT_TRUE(pos.has_value());
    EXPECT_EQ(*pos, (DataPosition{1, 2}));
    EXPECT_EQ(state.step, 3);
    expect_bitwise_equal(state.params, Small().trained().params, "params");
  }
}

TEST(Checkpointer, WithoutSavesNothingIsWritten) {
  const std::string dir = scratch("no_saves");
  Checkpointer ckpt({.dir = dir, .every = 1, .saves = false}, {});
  TrainState state = Small().trained();
  EXPECT_FALSE(ckpt.maybe_save(state, {}));
  EXPECT_EQ(ckpt.save(state, {}), "");
  EXPECT_FALSE(find_checkpoint(dir).has_value());
}

// A GPT saved with an untied head resumed into the same GPT with a tied one: refused,
// unless the head is dropped explicitly; the other tensors load.
TEST(Checkpointer, DropLetsAnUntiedHeadResumeIntoATiedModel) {
  models::TransformerConfig untied = gpt_config();
  untied.tp = {};
  untied.tied_embeddings = false;
  models::TransformerConfig tied = untied;
  tied.tied_embeddings = true;
  const optim::Adam opt({.learning_rate = optim::constant_schedule(0.01)});
  const std::string dir = scratch("drop_head");
  const TrainState saved =
      TrainState::create(models::Transformer(untied).init(Key::from_seed(1)), opt, Key{});
  Checkpointer(CheckpointConfig{.dir = dir}, {}).save(saved, {});
  auto resume = [&](std::vector<std::string> drop) {
    TrainState state =
        TrainState::create(models::Transformer(tied).init(Key::from_seed(5)), opt, Key{});
    Checkpointer({.dir = dir, .resume = Resume::Required, .drop = std::move(drop)}, {})
        .restore(state);
    return state;
  };
  EXPECT_THROW(resume({}), InvalidArgument);
  EXPECT_THROW(resume({"lm_head/kernel", "wte/*"}), InvalidArgument);  // the state has wte
  const TrainState state = resume({"lm_head/*"});
  EXPECT_FALSE(state.params.contains("lm_head/kernel"));
  for (const auto& [path, t] : state.params)
    EXPECT_EQ(t.to_vector<float>(), saved.params.at(path).to_vector<float>()) << path;
}

}  // namespace
}  // namespace distjax::train
