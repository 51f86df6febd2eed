// TOML config files and --set overrides: types from the schema, errors with file, line and
// column, nearest-key suggestions, and the round trip through to_toml.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "distjax/comm/launch_environment.hpp"
#include "distjax/config/config_file.hpp"
#include "distjax/core/error.hpp"

using namespace distjax;
using config::TrainConfig;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<other exception> ") + e.what();
  }
  return "<no exception>";
}

std::string parse_error(const std::string& toml) {
  return error_of([&] {
    TrainConfig c;
    config::apply_toml(c, toml, "test.toml");
  });
}

#define EXPECT_CONTAINS(haystack, needle)                                                         \
  do {                                                                                            \
    const std::string h_ = (haystack);                                                            \
    EXPECT_NE(h_.find(needle), std::string::npos) << "expected: " << (needle) << "\ngot: " << h_; \
  } while (0)

}  // namespace

TEST(ConfigFile, ParsesEveryTableAndType) {
  TrainConfig c;
  config::apply_toml(c, R"(
[run]
program = "gpt"
steps = 12
resume = true

[model]
dropout = 0.25

[optimizer]
lr = 1          # an integer is a fine number

[parallelism]
remat = ["Block"]

[parallelism.fsdp]
modules = ["*"]
min_weight_size = 1024

[distributed]
backend = "mpi"
mesh_shape = [2, 4]
mesh_axis_names = ["data", "model"]
mixed_precision = "bf16"
)",
                     "test.toml");
  EXPECT_EQ(c.run.program, "gpt");
  EXPECT_EQ(c.run.steps, 12);
  EXPECT_EQ(c.run.resume, config::Resume::Required);
  EXPECT_DOUBLE_EQ(c.model.dropout, 0.25);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1.0);
  EXPECT_EQ(c.parallelism.remat, (std::vector<std::string>{"Block"}));
  EXPECT_EQ(c.parallelism.fsdp.modules, (std::vector<std::string>{"*"}));
  EXPECT_EQ(c.parallelism.fsdp.min_weight_size, 1024);
  EXPECT_EQ(c.distributed.backend, config::BackendChoice::Mpi);
  EXPECT_EQ(c.distributed.mesh_shape, (std::vector<int>{2, 4}));
  EXPECT_EQ(c.distributed.mesh_axis_names, (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(c.distributed.mixed_precision, config::MixedPrecision::Bf16);
  EXPECT_EQ(c.run.batch_size, TrainConfig{}.run.batch_size);  // untouched keys keep defaults
}

TEST(ConfigFile, MalformedTomlGivesFileLineAndColumn) {
  const std::string msg = parse_error("[run]\nsteps = 3\nprogram = \"gpt\n");
  EXPECT_CONTAINS(msg, "[config] test.toml:3:");
  EXPECT_CONTAINS(msg, "TOML syntax error");
  EXPECT_CONTAINS(parse_error("[run]\nsteps = = 3\n"), "test.toml:2:");
}

TEST(ConfigFile, UnknownKeySuggestsTheNearest) {
  EXPECT_CONTAINS(parse_error("[run]\nsteps = 3\nstpes = 4\n"),
                  "test.toml:3:1: unknown key \"run.stpes\"; did you mean \"run.steps\"?");
  EXPECT_CONTAINS(parse_error("[run]\nlog_evry = 10\n"), "did you mean \"run.log_every\"?");
  // A key under the wrong table: the same key in its table.
  EXPECT_CONTAINS(parse_error("[model]\nlr = 0.1\n"),
                  "unknown key \"model.lr\"; did you mean \"optimizer.lr\"?");
  // An unknown table.
  EXPECT_CONTAINS(parse_error("[optimiser]\nlr = 0.1\n"),
                  "test.toml:1:2: unknown table \"optimiser\"");
  // Nothing close: no suggestion.
  const std::string far = parse_error("[run]\nxyzzy_frobnicate = 1\n");
  EXPECT_CONTAINS(far, "unknown key \"run.xyzzy_frobnicate\"");
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
}

TEST(ConfigFile, WrongTypeNamesKeyFileAndLine) {
  EXPECT_CONTAINS(parse_error("[run]\n\nsteps = \"ten\"\n"),
                  "test.toml:3:9: run.steps must be an integer, got a string");
  EXPECT_CONTAINS(parse_error("[run]\nresume = 1\n"),
                  "test.toml:2:10: run.resume must be a boolean or a string, got an integer");
  EXPECT_CONTAINS(parse_error("[distributed]\nmesh_shape = [2, \"x\"]\n"),
                  "distributed.mesh_shape must be an array of integers, got an array");
  EXPECT_CONTAINS(parse_error("[optimizer]\nlr = 1.5e400\n"), "test.toml:2:");
  EXPECT_CONTAINS(parse_error("run = 3\n"), "\"run\" is a table, not a key");
}

// run.resume: false, true or "auto", in a file and in --set; written back as it was given.
TEST(ConfigFile, ResumeIsABooleanOrAuto) {
  TrainConfig c;
  config::apply_toml(c, "[run]\nresume = \"auto\"\nresume_drop = [\"lm_head/*\"]\n", "test.toml");
  EXPECT_EQ(c.run.resume, config::Resume::Auto);
  EXPECT_EQ(c.run.resume_drop, (std::vector<std::string>{"lm_head/*"}));
  EXPECT_NE(config::to_toml(c).find("resume = \"auto\"\n"), std::string::npos)
      << config::to_toml(c);
  config::apply_override(c, "run.resume=false");
  EXPECT_EQ(c.run.resume, config::Resume::Off);
  EXPECT_NE(config::to_toml(c).find("resume = false\n"), std::string::npos) << config::to_toml(c);
  config::apply_override(c, "run.resume=auto");
  EXPECT_EQ(c.run.resume, config::Resume::Auto);
  config::apply_override(c, "run.resume=true");
  EXPECT_EQ(c.run.resume, config::Resume::Required);
  config::apply_override(c, "run.overwrite=true");
  EXPECT_TRUE(c.run.overwrite);
  EXPECT_CONTAINS(parse_error("[run]\nresume = \"maybe\"\n"),
                  "test.toml:2:10: run.resume must be one of \"false\", \"true\", \"auto\", got "
                  "\"maybe\"");
  EXPECT_CONTAINS(error_of([&] { config::apply_override(c, "run.resume=atuo"); }),
                  "did you mean \"auto\"?");
}

TEST(ConfigFile, ChoicesAndRangesAreChecked) {
  EXPECT_CONTAINS(parse_error("[distributed]\nbackend = \"mpii\"\n"),
                  "test.toml:2:11: distributed.backend must be one of \"auto\", \"threads\", "
                  "\"mpi\", \"nccl\", got \"mpii\"; did you mean \"mpi\"?");
  EXPECT_CONTAINS(parse_error("[distributed]\nmixed_precision = \"fp8\"\n"),
                  "distributed.mixed_precision must be one of \"no\", \"fp16\", \"bf16\"");
  EXPECT_CONTAINS(parse_error("[parallelism]\nremat = [\"Attention\"]\n"),
                  "parallelism.remat item must be one of \"Block\", \"Attn\", \"MLP\", got "
                  "\"Attention\"");
  EXPECT_CONTAINS(parse_error("[distributed]\nworld_size = 9999999999\n"),
                  "distributed.world_size = 9999999999 is out of range");
}

// TOML spells nan and inf, and --set reads TOML: a number a run cannot train with is
// refused with its key, wherever it comes from.
TEST(ConfigFile, NonFiniteNumbersAreRefusedWithTheirKey) {
  EXPECT_CONTAINS(parse_error("[optimizer]\nlr = nan\n"),
                  "test.toml:2:6: optimizer.lr = nan must be a finite number");
  EXPECT_CONTAINS(parse_error("[optimizer]\nfinal_lr_ratio = -inf\n"),
                  "optimizer.final_lr_ratio = -inf must be a finite number");
  TrainConfig c;
  EXPECT_CONTAINS(error_of([&] { config::apply_override(c, "optimizer.lr=inf"); }),
                  "--set optimizer.lr=inf: optimizer.lr = inf must be a finite number");
  EXPECT_CONTAINS(error_of([&] { config::apply_override(c, "model.dropout=nan"); }),
                  "model.dropout = nan must be a finite number");
}

TEST(ConfigFile, EveryErrorIsListedInFileOrder) {
  const std::string msg = parse_error("[run]\nstpes = 1\nbatch_size = \"x\"\n[model]\nhiden = 3\n");
  const auto a = msg.find("test.toml:2:"), b = msg.find("test.toml:3:"),
             c = msg.find("test.toml:5:");
  ASSERT_NE(a, std::string::npos) << msg;
  ASSERT_NE(b, std::string::npos) << msg;
  ASSERT_NE(c, std::string::npos) << msg;
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
}

TEST(ConfigFile, OverridesAreTypedBySchema) {
  TrainConfig c;
  config::apply_override(c, "run.steps=7");
  config::apply_override(c, "optimizer.lr = 0.5");
  config::apply_override(c, "run.resume=true");
  config::apply_override(c, "run.out_dir=/tmp/some dir");  // bare string
  config::apply_override(c, "run.program=\"gpt\"");        // quoted string
  config::apply_override(c, "distributed.mesh_shape=2,4");
  config::apply_override(c, "distributed.mesh_axis_names=[\"data\", \"model\"]");
  config::apply_override(c, "parallelism.fsdp.modules=*");
  config::apply_override(c, "distributed.backend=threads");
  EXPECT_EQ(c.run.steps, 7);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.run.resume, config::Resume::Required);
  EXPECT_EQ(c.run.out_dir, "/tmp/some dir");
  EXPECT_EQ(c.run.program, "gpt");
  EXPECT_EQ(c.distributed.mesh_shape, (std::vector<int>{2, 4}));
  EXPECT_EQ(c.distributed.mesh_axis_names, (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(c.parallelism.fsdp.modules, (std::vector<std::string>{"*"}));
  EXPECT_EQ(c.distributed.backend, config::BackendChoice::Threads);
}

TEST(ConfigFile, OverrideErrorsNameTheOverride) {
  TrainConfig c;
  EXPECT_CONTAINS(error_of([&] { config::apply_override(c, "run.steps=abc"); }),
                  "[config] --set run.steps=abc: run.steps must be an integer, got \"abc\"");
  EXPECT_CONTAINS(
      error_of([&] { config::apply_override(c, "run.stepz=3"); }),
      "[config] --set run.stepz=3: unknown key \"run.stepz\"; did you mean \"run.steps\"?");
  EXPECT_CONTAINS(error_of([&] { config::apply_override(c, "run.steps"); }),
                  "--set run.steps: expected key=value");
  EXPECT_CONTAINS(error_of([&] { config::apply_override(c, "distributed.backend=gloo"); }),
                  "--set distributed.backend=gloo: distributed.backend must be one of");
  EXPECT_CONTAINS(error_of([&] { config::apply_override(c, "distributed.mesh_shape=2,x"); }),
                  "distributed.mesh_shape must be an array of integers");
  EXPECT_CONTAINS(error_of([&] { config::apply_override(c, "run=3"); }),
                  "\"run\" is a table, not a key");
}

TEST(ConfigFile, LoadConfigAppliesFileThenOverrides) {
  const auto path = std::filesystem::temp_directory_path() / "distjax_config_file_test.toml";
  std::ofstream(path) << "[run]\nprogram = \"gpt\"\nsteps = 5\n";
  const TrainConfig c = config::load_config(path.string(), {"run.steps=9"});
  EXPECT_EQ(c.run.program, "gpt");
  EXPECT_EQ(c.run.steps, 9);
  std::filesystem::remove(path);
  EXPECT_THROW(config::load_config("/nonexistent/x.toml"), IoError);
}

TEST(ConfigFile, ToTomlRoundTrips) {
  TrainConfig c;
  c.run.program = "gpt";
  c.run.out_dir = "runs/\"quoted\"";
  c.optimizer.lr = 3e-3;
  c.model.dropout = 0.0;
  c.parallelism.remat = {"Block"};
  c.distributed.mesh_shape = {2, 4};
  c.distributed.mesh_axis_names = {"data", "model"};
  c.distributed.backend = config::BackendChoice::Mpi;
  const std::string text = config::to_toml(c);
  TrainConfig back;
  config::apply_toml(back, text, "roundtrip");
  EXPECT_EQ(config::to_toml(back), text);
  EXPECT_EQ(back.run.out_dir, c.run.out_dir);
  EXPECT_DOUBLE_EQ(back.optimizer.lr, 3e-3);
  // Every key of the schema is written.
  for (const config::ConfigKey& k : config::config_keys())
    EXPECT_NE(text.find(k.name.substr(k.name.rfind('.') + 1) + " = "), std::string::npos) << k.name;
}

// ZeRO's stages are one key, parallelism.shard; fsdp.modules filters "parameters". The old
// spellings (zero_stage, and fsdp.modules alone turning FSDP on) are read, with a notice
// naming the new key, and never written.
TEST(ConfigFile, ShardIsOneKeyAndTheOldSpellingsAreReadWithANotice) {
  TrainConfig c;
  config::apply_toml(c, "[parallelism]\nshard = \"gradients\"\n", "new.toml");
  EXPECT_EQ(c.parallelism.shard, config::Shard::Gradients);
  EXPECT_TRUE(c.notices.empty());

  c = TrainConfig{};
  config::apply_toml(c, "[parallelism]\nzero_stage = 1\n", "old.toml");
  EXPECT_EQ(c.parallelism.shard, config::Shard::Optimizer);
  ASSERT_EQ(c.notices.size(), 1u);
  EXPECT_NE(c.notices[0].find("parallelism.shard = \"optimizer\""), std::string::npos)
      << c.notices[0];

  // The old ZeRO-3: zero_stage = 0 with the modules named.
  c = TrainConfig{};
  config::apply_toml(c, "[parallelism]\nzero_stage = 0\n[parallelism.fsdp]\nmodules = [\"*\"]\n",
                     "old.toml");
  EXPECT_EQ(c.parallelism.shard, config::Shard::Parameters);
  EXPECT_EQ(c.notices.size(), 2u);
  for (const std::string& problem : c.problems())
    EXPECT_EQ(problem.find("fsdp"), std::string::npos) << problem;
  c = TrainConfig{};
  config::apply_override(c, "parallelism.fsdp.modules=Block");
  EXPECT_EQ(c.parallelism.shard, config::Shard::Parameters);
  EXPECT_EQ(c.notices.size(), 1u);

  // The modules as the filter of the new key: no notice.
  c = TrainConfig{};
  config::apply_toml(c, "[parallelism]\nshard = \"parameters\"\n[parallelism.fsdp]\nmodules = [\"MLP\"]\n",
                     "new.toml");
  EXPECT_EQ(c.parallelism.shard, config::Shard::Parameters);
  EXPECT_TRUE(c.notices.empty());

  // The two keys disagreeing, or a stage beyond the old key's, are errors naming both.
  c = TrainConfig{};
  const std::string both = parse_error("[parallelism]\nshard = \"optimizer\"\nzero_stage = 2\n");
  EXPECT_NE(both.find("contradicts parallelism.shard = \"optimizer\""), std::string::npos) << both;
  EXPECT_NE(parse_error("[parallelism]\nzero_stage = 3\n").find("parallelism.shard"),
            std::string::npos);
  // A file's filter stays valid when --set picks another shard: it is then unused.
  c = TrainConfig{};
  config::apply_toml(c, "[parallelism]\nshard = \"parameters\"\n[parallelism.fsdp]\nmodules = [\"*\"]\n",
                     "file.toml");
  config::apply_override(c, "parallelism.shard=optimizer");
  EXPECT_EQ(c.parallelism.shard, config::Shard::Optimizer);
  for (const std::string& problem : c.problems())
    EXPECT_EQ(problem.find("fsdp"), std::string::npos) << problem;

  // Written under the new name only.
  c = TrainConfig{};
  c.parallelism.shard = config::Shard::Parameters;
  const std::string text = config::to_toml(c);
  EXPECT_NE(text.find("shard = \"parameters\""), std::string::npos);
  EXPECT_EQ(text.find("zero_stage"), std::string::npos);
  for (const config::ConfigKey& k : config::config_keys())
    EXPECT_NE(k.name, "parallelism.zero_stage");
}

TEST(ConfigFile, NearestKey) {
  EXPECT_EQ(config::nearest_key("run.stpes"), "run.steps");
  EXPECT_EQ(config::nearest_key("optimizer.learning_rate"), "");
  EXPECT_EQ(config::nearest_key("distributed.wold_size"), "distributed.world_size");
  EXPECT_EQ(config::nearest_key("parallelism.tensor_parallel_size"),
            "distributed.tensor_parallel_size");
}

// The fuzzer's regression inputs of the config reader (fuzz/corpus/config/regressions/), read
// as `distjax train` reads them: each is refused with a ConfigError naming what is wrong.
TEST(ConfigFile, FuzzRegressionsAreRefusedWithTheirKey) {
  const std::string dir = std::string(DISTJAX_SOURCE_DIR) + "/fuzz/corpus/config/regressions/";
  // Three mesh sizes of 2^31 - 1: their product overflowed int64 in the validation.
  std::ifstream f(dir + "mesh_shape_overflow.toml", std::ios::binary);
  ASSERT_TRUE(f.good());
  const std::string toml{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  EXPECT_CONTAINS(error_of([&] {
                    TrainConfig c;
                    config::apply_toml(c, toml, "mesh_shape_overflow.toml");
                    c.distributed = config::resolve(c.distributed, comm::LaunchEnvironment{});
                    c.validate("mesh_shape_overflow.toml");
                  }),
                  "mesh_shape = [2147483647, 2147483647, 2147483647] has more than 2147483647 "
                  "devices");
}

// A --set string that is not UTF-8 (the fuzzer's input: a TOML document, a NUL, then the --set
// lines) was taken as is, and to_toml then printed a document no reader takes back; a string
// with a control character read from a file was printed raw, too.
TEST(ConfigFile, StringsThatToTomlCannotPrintAreRefusedOrEscaped) {
  std::ifstream f(std::string(DISTJAX_SOURCE_DIR) +
                      "/fuzz/corpus/config/regressions/set_string_not_utf8.bin",
                  std::ios::binary);
  ASSERT_TRUE(f.good());
  const std::string input{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  const std::size_t at = input.find("distributed.master_addr=");
  ASSERT_NE(at, std::string::npos);
  // Without its NUL bytes, which a command line cannot hold (and an error's what() cuts at).
  std::string assignment = input.substr(at, input.find('\n', at) - at);
  std::erase(assignment, '\0');
  EXPECT_CONTAINS(error_of([&] {
                    TrainConfig c;
                    config::apply_override(c, assignment);
                  }),
                  "distributed.master_addr must be a string: ");
  TrainConfig c;
  config::apply_toml(c, "[run]\nout_dir = \"a\\nb\\u0001\"\n", "test.toml");
  ASSERT_EQ(c.run.out_dir, "a\nb\x01");
  TrainConfig again;
  config::apply_toml(again, config::to_toml(c), "to_toml");
  EXPECT_EQ(again.run.out_dir, c.run.out_dir);
}
