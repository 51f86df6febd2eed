// The example binaries and `distjax train configs/<example>.toml` run the same config: the
// configs built into the library are the files of configs/. `distjax plan` suggests for
// each program only setups that pass the checks `distjax train` runs before running it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "distjax/app/networks.hpp"
#include "distjax/app/train.hpp"
#include "distjax/config/config_file.hpp"
#include "distjax/core/error.hpp"
#include "distjax/nn/dense.hpp"
#include "distjax/plan/plan.hpp"

using namespace distjax;

namespace {

std::string file_config(const std::string& name) {
  return config::to_toml(
      config::load_config(std::string(DISTJAX_SOURCE_DIR) + "/configs/" + name + ".toml"));
}

}  // namespace

// Each example binary starts from its config as built into the library: the same as the
// file under configs/ (the build embeds the files), and every program has one.
TEST(Programs, BuiltinConfigsAreTheFiles) {
  std::set<std::string> files;
  for (const auto& f :
       std::filesystem::directory_iterator(std::string(DISTJAX_SOURCE_DIR) + "/configs"))
    if (f.path().extension() == ".toml") files.insert(f.path().stem().string());
  const std::vector<std::string> names = app::builtin_configs();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), files);
  std::set<std::string> programs_with_a_config;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const config::TrainConfig c = app::builtin_config(name);
    EXPECT_EQ(config::to_toml(c), file_config(name));
    programs_with_a_config.insert(c.run.program);
  }
  for (const app::ModelSpec& m : app::models())
    EXPECT_TRUE(programs_with_a_config.count(m.name)) << m.name << " has no config";
  EXPECT_THROW(app::builtin_config("train_mnst"), ConfigError);
}

// The schema's help of run.program (what `distjax train --help-config` and configs.md say)
// names every model of the library's registry.
TEST(Programs, TheHelpOfRunProgramNamesEveryModel) {
  std::string help;
  for (const config::ConfigKey& k : config::config_keys())
    if (k.name == "run.program") help = k.help;
  ASSERT_FALSE(help.empty());
  for (const app::ModelSpec& m : app::models())
    EXPECT_NE(help.find(m.name), std::string::npos) << m.name << " is missing from: " << help;
}

TEST(Programs, UnknownModelSuggestsTheNearest) {
  try {
    app::find_model("clasifier");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean \"classifier\"?"), std::string::npos)
        << e.what();
  }
}

// A model registered from outside the library trains through app::train as the library's
// do: the config's mesh, its evaluation, summary.json with the whole model's parameters;
// its name is then one of the models, and a second registration of it is refused. (It
// stays registered in this process: it comes after the tests that list the library's.)
TEST(Programs, AModelRegisteredOutsideTrainsThroughTrain) {
  app::register_model({.name = "test_linear",
                       .about = "a linear classifier of Fashion-MNIST",
                       .epochs = true,
                       .build = [](const config::TrainConfig& c, const mesh::Mesh&) {
                         app::Model m = app::fashion_mnist_model(c);
                         m.network = app::network_of(
                             [](const nn::Scope& s, const tensor::Tensor& x) {
                               return nn::Dense{.features = 10}(s.child("fc"), x);
                             },
                             tensor::Tensor::zeros({1, 784}));
                         return m;
                       }});
  EXPECT_THROW(app::register_model({.name = "test_linear",
                                    .about = "another",
                                    .build = [](const config::TrainConfig&,
                                                const mesh::Mesh&) { return app::Model{}; }}),
               ConfigError);
  EXPECT_EQ(app::find_model("test_linear").about, "a linear classifier of Fashion-MNIST");
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / ("distjax_registered_" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  config::TrainConfig c = app::builtin_config("train_mnist");
  c.run.program = "test_linear";
  c.run.epochs = 0;
  c.run.steps = 30;
  c.run.out_dir = out.string();
  c.distributed.world_size = 2;
  ASSERT_EQ(app::train(c), 0);
  std::ifstream in(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary["num_parameters"].get<long long>(), 784 * 10 + 10);  // counted on the host
  EXPECT_EQ(summary["mesh"].get<std::string>(), "(\"data\"=2)");
  EXPECT_EQ(summary["steps"].get<long long>(), 30);
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.5);  // chance: 0.1
  std::filesystem::remove_all(out);
}

// Tensor parallelism is the composition's: it hands the model's own transform
// (Network::tensor_parallel) the plan of parallelism.tp_layout on every device of a mesh
// whose "model" axis splits, and refuses such a mesh for a model without one.
TEST(Programs, TheCompositionLaysTheModelOutOverModel) {
  struct Seen {
    std::mutex mu;
    std::vector<parallel::TPPlan> plans;
  };
  const auto seen = std::make_shared<Seen>();
  // A small residual classifier whose transform is watched.
  const auto small = [] {
    return app::residual_classifier_network({.hidden = 16, .num_layers = 1, .dropout = 0.f});
  };
  app::register_model(
      {.name = "test_tp_mlp",
       .about = "a small residual classifier whose tensor-parallel transform is watched",
       .axes = {"data", "model"},
       .capabilities = {.tensor_parallel = true},
       .epochs = true,
       .build = [seen, small](const config::TrainConfig& c, const mesh::Mesh&) {
         app::Model m = app::fashion_mnist_model(c);
         m.network = small();
         m.network.tensor_parallel =
             [seen, laid = m.network.tensor_parallel](const parallel::TPPlan& tp) {
               const std::lock_guard lock(seen->mu);
               seen->plans.push_back(tp);
               return laid(tp);
             };
         return m;
       }});
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / ("distjax_tp_" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  config::TrainConfig c = app::builtin_config("tensor_parallelism");  // (data=2, model=4)
  c.run.program = "test_tp_mlp";
  c.run.epochs = 0;
  c.run.steps = 2;
  c.run.out_dir = out.string();
  c.parallelism.tp_layout = "async";
  c.parallelism.bidirectional = true;
  ASSERT_EQ(app::train(c), 0);
  ASSERT_EQ(seen->plans.size(), 8u);  // every device's composition
  for (const parallel::TPPlan& tp : seen->plans) {
    EXPECT_EQ(tp.layout, parallel::TPLayout::Async);
    EXPECT_EQ(tp.axis, "model");
    EXPECT_TRUE(tp.bidirectional);
  }
  const auto final_loss = [&out] {
    std::ifstream in(out / "summary.json");
    return nlohmann::json::parse(in)["final_metrics"]["train_loss"].get<double>();
  };
  const double laid_out = final_loss();
  // One device along "model": no transform, and the same model (the same losses).
  seen->plans.clear();
  c.distributed.world_size = 2;
  c.distributed.tensor_parallel_size = 1;
  c.distributed.mesh_shape = {2, 1};
  c.run.overwrite = true;
  ASSERT_EQ(app::train(c), 0);
  EXPECT_TRUE(seen->plans.empty());
  EXPECT_NEAR(final_loss(), laid_out, 1e-4);
  // A model without a layout on a split "model" axis: refused, naming what is missing.
  app::register_model({.name = "test_no_tp_mlp",
                       .about = "a small residual classifier without a tensor-parallel layout",
                       .axes = {"data", "model"},
                       .capabilities = {.tensor_parallel = true},
                       .epochs = true,
                       .build = [small](const config::TrainConfig& c, const mesh::Mesh&) {
                         app::Model m = app::fashion_mnist_model(c);
                         m.network = small();
                         m.network.tensor_parallel = nullptr;
                         return m;
                       }});
  c = app::builtin_config("tensor_parallelism");
  c.run.program = "test_no_tp_mlp";
  c.run.steps = 2;
  c.run.out_dir = out.string();
  c.run.overwrite = true;
  try {
    app::train(c);
    ADD_FAILURE() << "a model without a tensor-parallel layout ran on model=4";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a model with a tensor-parallel layout"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(out);
}

// The programs that came before the registry are read as the model they ran, said.
TEST(Programs, OldProgramNamesReadAsTheirModel) {
  const std::pair<const char*, const char*> renamed[] = {{"train_mnist", "classifier"},
                                                         {"data_parallelism", "classifier"},
                                                         {"tensor_parallelism", "tp_classifier"},
                                                         {"pipeline_parallelism", "pp_classifier"},
                                                         {"train_gpt", "gpt"}};
  for (const auto& [before, now] : renamed) {
    config::TrainConfig c;
    config::apply_override(c, std::string("run.program=") + before);
    EXPECT_EQ(c.run.program, now);
    ASSERT_EQ(c.notices.size(), 1u) << before;
    EXPECT_NE(c.notices[0].find(std::string("run.program = \"") + now + "\""), std::string::npos)
        << c.notices[0];
  }
  config::TrainConfig gpt;
  config::apply_override(gpt, "run.program=gpt");
  EXPECT_TRUE(gpt.notices.empty());
}

// prepare_program makes run.out_dir; one it cannot make or write is a ConfigError naming
// the key and the path (not a bare file-system error).
TEST(Programs, AnUnusableOutDirNamesTheKey) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / "distjax_programs_test_file";
  std::ofstream(file) << "a file, not a directory\n";
  for (const std::string& out :
       {(file / "run").string(), std::string("/proc/distjax_no_such_dir"), std::string("/proc")}) {
    SCOPED_TRACE(out);
    config::TrainConfig c = app::builtin_config("train_gpt");
    c.run.out_dir = out;
    try {
      app::prepare_program(c);
      ADD_FAILURE() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("run.out_dir = \"" + out + "\""), std::string::npos)
          << e.what();
    }
  }
  std::filesystem::remove(file);
}

// Every setup plan::meshes_that_fit lists, under any budget, for each program's defaults and
// each shipped config, on 1, 2, 4, 8 devices and the config's own count, applied to that
// config (plan::apply_setup), is one prepare_program (what `distjax train` runs before the
// program) accepts.
TEST(Programs, ThePlannerSuggestsOnlyWhatTheProgramRuns) {
  std::vector<std::pair<std::string, config::TrainConfig>> bases;
  std::vector<std::filesystem::path> files;
  for (const auto& f :
       std::filesystem::directory_iterator(std::string(DISTJAX_SOURCE_DIR) + "/configs"))
    if (f.path().extension() == ".toml") files.push_back(f.path());
  std::sort(files.begin(), files.end());
  for (const std::filesystem::path& f : files)
    bases.emplace_back(f.filename().string(), config::load_config(f.string()));
  std::set<std::string> planned, unplanned;
  int suggestions = 0;
  // prepare_program makes run.out_dir and looks for checkpoints there: one empty directory.
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / "distjax_programs_plan_test";
  std::filesystem::remove_all(out);
  for (auto& [name, base] : bases) {
    base.run.steps = std::max<std::int64_t>(base.run.steps, 1);
    base.run.out_dir = out.string();
    base = app::prepare_program(base, name);  // the base itself runs
    plan::ModelDescription model;
    try {
      model = plan::model_from_config(base);
    } catch (const NotImplemented&) {
      unplanned.insert(base.run.program);  // `distjax plan` refuses it, naming the program
      continue;
    }
    planned.insert(base.run.program);
    const plan::Setup setup = plan::setup_from_config(base);
    const config::ProgramCapabilities runs =
        app::find_model(base.run.program).capabilities.for_config(base);
    for (int world : {1, 2, 4, 8, base.distributed.world_size}) {
      for (const plan::Plan& p : plan::meshes_that_fit(model, setup, world, 1e300, runs)) {
        ++suggestions;
        try {
          app::prepare_program(plan::apply_setup(base, p.setup), name);
        } catch (const Error& e) {
          ADD_FAILURE() << name << ": the plan suggests " << plan::describe_setup(p.setup)
                        << " (micro-batches " << p.setup.microbatches << "), which "
                        << base.run.program << " refuses:\n"
                        << e.what();
        }
      }
    }
  }
  std::string checked, skipped;
  for (const std::string& p : planned)
    checked += " " + p;
  for (const std::string& p : unplanned)
    skipped += " " + p;
  std::printf("%d suggestions checked, programs%s; no planning model:%s\n", suggestions,
              checked.c_str(), skipped.c_str());
  EXPECT_EQ(planned, (std::set<std::string>{"classifier", "gpt"}));
  EXPECT_GT(suggestions, 50);
  std::filesystem::remove_all(out);
}

// A command line the parser refused gets "did you mean" lines: a first word near a
// subcommand, a flag near a known one, `--set KEY VALUE` for `--set KEY=VALUE`; none for
// what is far from everything.
TEST(Programs, CommandLineMistakesGetSuggestions) {
  const std::vector<std::string> subs = {"train", "ckpt", "inspect", "plan"};
  const std::vector<std::string> flags = {"--set",       "--out",          "--resume",
                                          "--overwrite", "--print-config", "--help"};
  EXPECT_EQ(app::command_line_hint({"trian", "configs/a.toml"}, subs, flags),
            "did you mean \"train\"?\n");
  EXPECT_EQ(app::command_line_hint({"train", "a.toml", "--ouput", "runs/x"}, subs, flags),
            "did you mean --out (not --ouput)?\n");
  EXPECT_EQ(app::command_line_hint({"train", "a.toml", "--overwrit"}, subs, flags),
            "did you mean --overwrite (not --overwrit)?\n");
  EXPECT_EQ(app::command_line_hint({"train", "a.toml", "--set", "run.steps", "20"}, subs, flags),
            "did you mean --set run.steps=20?\n");
  EXPECT_EQ(app::command_line_hint({"train", "a.toml", "--set", "run.steps=20"}, subs, flags), "");
  EXPECT_EQ(app::command_line_hint({"zzzzzzzzzz"}, subs, flags), "");
  EXPECT_EQ(app::command_line_hint({"train", "--completely-unrelated-flag"}, subs, flags), "");
}

// A config path with a typo names the nearest config of its directory.
TEST(Programs, AMistypedConfigPathSuggestsTheNearest) {
  try {
    config::load_config(std::string(DISTJAX_SOURCE_DIR) + "/configs/gpt3d.toml");
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean " + std::string(DISTJAX_SOURCE_DIR) +
                                         "/configs/gpt_3d.toml?"),
              std::string::npos)
        << e.what();
  }
}
