// Checkpoints that cannot be loaded give clear errors naming the file and what is wrong
// (broken, truncated or missing files, a ZeRO state without its strategy, leftovers of an
// interrupted save, an error on one device), and the files read by Python's safetensors.
#include "distjax/train/detail/checksum.hpp"
#include "distjax/train/detail/safetensors.hpp"
#include "tools/tool_run.hpp"
#include "train/checkpoint_test_util.hpp"

namespace distjax::train {
namespace {

using namespace checkpoint_testing;
namespace fs = std::filesystem;
using json = nlohmann::json;
using mesh::Mesh;
using spmd::DeviceContext;
using tensor::Tensor;
// A one-device checkpoint of the small classifier; returns its step directory.
std::string small_checkpoint(const std::string& name) {
  Small s;
  return save_checkpoint(scratch(name), s.trained(), {});
}

std::string load_error(const std::string& dir, TrainState t = Small().fresh()) {
  try {
    load_checkpoint(dir, t, {});
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// Rewrites the safetensors header of `file` with `edit` (data unchanged).
void edit_header(const fs::path& file, const std::function<void(json&)>& edit) {
  const std::string bytes = read_bytes(file);
  std::uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  json h = json::parse(bytes.substr(8, len));
  edit(h);
  const std::string text = h.dump();
  const std::uint64_t n = text.size();
  write_bytes(file,
              std::string(reinterpret_cast<const char*>(&n), 8) + text + bytes.substr(8 + len));
}

// Each kind of damage and (part of) the message it must give. Every message names the
// file.
TEST(CheckpointErrors, BrokenFilesAreNamedWithWhatIsWrong) {
  struct Case {
    std::string what;
    std::function<void(const fs::path& step_dir)> damage;
    std::string file;  // the file the message must name
    std::string message;
  };
  const std::string shard = "device_00000.safetensors";
  const std::vector<Case> cases = {
      {"missing shard file", [&](const fs::path& d) { fs::remove(d / shard); }, shard,
       "cannot open"},
      {"file shorter than 8 bytes", [&](const fs::path& d) { write_bytes(d / shard, "abc"); },
       shard, "bad header length: the file has 3 bytes"},
      {"header length beyond the file",
       [&](const fs::path& d) {
         std::string b = read_bytes(d / shard);
         const std::uint64_t huge = 1u << 30;
         std::memcpy(b.data(), &huge, 8);
         write_bytes(d / shard, b);
       },
       shard, "bad header length 1073741824"},
      {"header not JSON",
       [&](const fs::path& d) {
         std::string b = read_bytes(d / shard);
         b[8] = '#';
         write_bytes(d / shard, b);
       },
       shard, "header is not valid JSON"},
      {"truncated data",
       [&](const fs::path& d) {
         const std::string b = read_bytes(d / shard);
         write_bytes(d / shard, b.substr(0, b.size() - 100));
       },
       shard, "are beyond the data section"},
      {"missing tensor",
       [&](const fs::path& d) {
         edit_header(d / shard, [](json& h) { h.erase("params/fc2/bias"); });
       },
       shard, "missing tensor \"params/fc2/bias\""},
      {"dtype differs from the index",
       [&](const fs::path& d) {
         edit_header(d / shard, [](json& h) { h["params/fc2/bias"]["dtype"] = "I32"; });
       },
       shard, "tensor \"params/fc2/bias\" is I32 (3,) but the index says F32 (3,)"},
      {"shape differs from the index",
       [&](const fs::path& d) {
         edit_header(d / shard, [](json& h) { h["params/fc1/kernel"]["shape"] = {8, 6}; });
       },
       shard, "tensor \"params/fc1/kernel\" is F32 (8, 6) but the index says F32 (6, 8)"},
      {"index not JSON", [&](const fs::path& d) { write_bytes(d / "index.json", "{\"step\": 3,"); },
       "index.json", "not valid JSON: [json.exception.parse_error"},
      {"index without tensors",
       [&](const fs::path& d) {
         json j = json::parse(read_bytes(d / "index.json"));
         j.erase("tensors");
         write_bytes(d / "index.json", j.dump());
       },
       "index.json",
       "missing or malformed field: [json.exception.out_of_range.403] key 'tensors' not found"},
      {"tensor missing from the index",
       [&](const fs::path& d) {
         json j = json::parse(read_bytes(d / "index.json"));
         j["tensors"].erase("opt_state/nu/fc1/bias");
         write_bytes(d / "index.json", j.dump());
       },
       "index.json",
       "1 tensor of the state is missing from the checkpoint: \"opt_state/nu/fc1/bias\""},
      {"global shape differs from the state",
       [&](const fs::path& d) {
         json j = json::parse(read_bytes(d / "index.json"));
         j["tensors"]["params/fc1/bias"]["shape"] = {9};
         write_bytes(d / "index.json", j.dump());
       },
       "index.json", "tensor \"params/fc1/bias\" in"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const fs::path dir = small_checkpoint("broken");
    c.damage(dir);
    const std::string msg = load_error(dir.string());
    EXPECT_NE(msg.find("[load_checkpoint]"), std::string::npos) << msg;
    EXPECT_NE(msg.find((dir / c.file).string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
    if (std::getenv("DISTJAX_TEST_PRINT")) std::cout << msg << "\n";
  }
  // The state's own shape is named too.
  const fs::path dir = small_checkpoint("broken_shape");
  json j = json::parse(read_bytes(dir / "index.json"));
  j["tensors"]["params/fc1/bias"]["shape"] = {9};
  write_bytes(dir / "index.json", j.dump());
  EXPECT_NE(load_error(dir.string()).find("is f32 (9,); the state being loaded has f32 (8,)"),
            std::string::npos)
      << load_error(dir.string());
}

// The byte offset in `file` of the data of tensor `name` (from its safetensors header).
std::uint64_t data_offset(const fs::path& file, const std::string& name) {
  const std::string bytes = read_bytes(file);
  std::uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  const json h = json::parse(bytes.substr(8, len));
  return 8 + len + h.at(name).at("data_offsets")[0].get<std::uint64_t>();
}

TEST(CheckpointErrors, AFlippedByteNamesTheFileAndTheTensor) {
  const fs::path dir = small_checkpoint("flipped");
  const fs::path shard = dir / "device_00000.safetensors";
  std::string b = read_bytes(shard);
  b[data_offset(shard, "opt_state/nu/fc1/kernel") + 5] ^= 0x10;  // one bit of one element
  write_bytes(shard, b);
  const std::string msg = load_error(dir.string());
  EXPECT_NE(msg.find("[load_checkpoint] \"" + shard.string() +
                     "\": tensor "
                     "\"opt_state/nu/fc1/kernel\": checksum mismatch"),
            std::string::npos)
      << msg;
}

TEST(CheckpointErrors, IndexStepDisagreesWithItsDirectory) {
  const fs::path dir = small_checkpoint("step_mismatch");  // step_00000003
  json j = json::parse(read_bytes(dir / "index.json"));
  j["step"] = 2;
  write_bytes(dir / "index.json", j.dump());
  const std::string msg = load_error(dir.string());
  EXPECT_NE(msg.find("\"" + (dir / "index.json").string() +
                     "\" says step 2 but its directory "
                     "is step_00000003"),
            std::string::npos)
      << msg;
}

// Every tensor of the state must be in the checkpoint and every tensor of the checkpoint
// must be loaded: the message counts both and names the first few.
TEST(CheckpointErrors, LoadIsStrictInBothDirections) {
  const fs::path dir = small_checkpoint("strict");
  const std::string where = (dir / "index.json").string();
  Small s;
  {  // A state without optimizer state: the checkpoint's 8 slots are extra.
    TrainState t = s.fresh();
    t.opt_state = TensorTree();
    const std::string msg = load_error(dir.string(), t);
    EXPECT_NE(msg.find("[load_checkpoint] \"" + where + "\" does not match the state being loaded"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("8 tensors of the checkpoint are not in the state: "
                       "\"opt_state/mu/fc1/bias\", \"opt_state/mu/fc1/kernel\", "
                       "\"opt_state/mu/fc2/bias\", \"opt_state/mu/fc2/kernel\", "
                       "\"opt_state/nu/fc1/bias\" and 3 more"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("missing from the checkpoint"), std::string::npos) << msg;
    // Dropped explicitly, the parameters load alone.
    load_checkpoint(dir.string(), t, {}, {.drop = {"opt_state/*"}});
    expect_bitwise_equal(t.params, s.trained().params, "params");
  }
  {  // A state with a leaf the checkpoint lacks, and without one it has: both listed.
    TrainState t = s.fresh();
    t.params.set("fc3/kernel", Tensor::zeros({3, 3}));
    t.opt_state.set("mu/fc3/kernel", Tensor::zeros({3, 3}));
    t.opt_state.set("nu/fc3/kernel", Tensor::zeros({3, 3}));
    t.params.erase("fc2/bias");
    t.opt_state.erase("mu/fc2/bias");
    t.opt_state.erase("nu/fc2/bias");
    const std::string msg = load_error(dir.string(), t);
    EXPECT_NE(msg.find("3 tensors of the state are missing from the checkpoint: "
                       "\"opt_state/mu/fc3/kernel\", \"opt_state/nu/fc3/kernel\", "
                       "\"params/fc3/kernel\""),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("3 tensors of the checkpoint are not in the state: "
                       "\"opt_state/mu/fc2/bias\", \"opt_state/nu/fc2/bias\", "
                       "\"params/fc2/bias\""),
              std::string::npos)
        << msg;
  }
}

// A GPT saved with an untied head, loaded into the same GPT with its head tied to the
// embedding: lm_head and its optimizer slots are extra, and loading them silently away
// would drop trained weights.
TEST(CheckpointErrors, UntiedHeadIntoATiedModel) {
  models::TransformerConfig untied = gpt_config();
  untied.tp = {};
  untied.tied_embeddings = false;
  models::TransformerConfig tied = untied;
  tied.tied_embeddings = true;
  const optim::Adam opt({.learning_rate = optim::constant_schedule(0.01)});
  const std::string dir = scratch("untied");
  save_checkpoint(dir,
                  TrainState::create(models::Transformer(untied).init(Key::from_seed(1)), opt,
                                     Key::from_seed(2)),
                  {});
  TrainState state =
      TrainState::create(models::Transformer(tied).init(Key::from_seed(1)), opt, Key::from_seed(2));
  const std::string msg = load_error(dir, state);
  EXPECT_NE(msg.find("3 tensors of the checkpoint are not in the state: "
                     "\"opt_state/mu/lm_head/kernel\", \"opt_state/nu/lm_head/kernel\", "
                     "\"params/lm_head/kernel\""),
            std::string::npos)
      << msg;
}

// The fuzzers' regression inputs of the index and safetensors readers
// (fuzz/corpus/<reader>/regressions/): sizes whose products overflowed (UBSan) are refused,
// naming the file and what is wrong.
TEST(CheckpointErrors, FuzzRegressionsAreRefusedNamingTheFile) {
  const fs::path fuzz = fs::path(DISTJAX_SOURCE_DIR) / "fuzz" / "corpus";
  const std::vector<std::pair<std::string, std::string>> indexes = {
      {"block_shape_overflow.json",
       "a block of \"params/w\" in device_00000.safetensors at offset (0, 0) with shape "
       "(4611686018427387904, 4) is not inside the tensor's shape (4, 2)"},
      {"float_for_an_integer.json",
       "checksum.chunk_bytes must be an integer, got 1.04666"},
      {"mesh_size_overflow.json",
       "mesh: [Mesh] axis \"model\" of size 65536 makes more than 2147483647 devices"}};
  for (const auto& [name, expected] : indexes) {
    const fs::path dir = scratch("fuzz_" + name);
    fs::copy_file(fuzz / "checkpoint_index" / "regressions" / name, dir / "index.json");
    std::string msg = "no error";
    try {
      read_checkpoint_index(dir.string());
    } catch (const IoError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("\"" + (dir / "index.json").string() + "\": " + expected), std::string::npos)
        << name << ": " << msg;
  }
  const std::string file =
      (fuzz / "safetensors" / "regressions" / "shape_overflow.safetensors").string();
  const detail::SafetensorsReader reader(file, "load_checkpoint");
  std::string msg = "no error";
  try {
    reader.entry("x", DType::F32, reader.entries().at("x").shape);
  } catch (const IoError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("\"" + file +
                     "\": tensor \"x\" has shape (4611686018427387904, 4), which no tensor can "
                     "have"),
            std::string::npos)
      << msg;
}

TEST(CheckpointErrors, AnIndexWithoutChecksumsIsRefused) {
  const fs::path dir = small_checkpoint("version1");
  json j = json::parse(read_bytes(dir / "index.json"));
  j["version"] = 1;
  j.erase("checksum");
  write_bytes(dir / "index.json", j.dump());
  const std::string msg = load_error(dir.string());
  EXPECT_NE(msg.find("\"" + (dir / "index.json").string() +
                     "\": version 1 is not supported: this build reads version 2 (version 1 has "
                     "no checksums of the data)"),
            std::string::npos)
      << msg;
}

TEST(CheckpointErrors, ChecksumsAreZlibsCrc32InChunks) {
  // The check value of CRC-32 (ISO-HDLC): Python's zlib.crc32(b"123456789") too.
  EXPECT_EQ(detail::crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(detail::hex32(0xCBF43926u), "0xcbf43926");
  const std::string data(2500, 'x');
  const std::vector<std::uint32_t> chunks = detail::chunk_crc32(data.data(), data.size(), 1000);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0], detail::crc32(data.data(), 1000));
  EXPECT_EQ(chunks[2], detail::crc32(data.data(), 500));
  EXPECT_TRUE(detail::chunk_crc32(data.data(), 0, 1000).empty());
}

// A block of several checksum chunks loaded on three devices, each reading one row (one
// chunk): a flipped byte in the last row is found by the device that reads it, raised on
// every device, and named with its chunk's bytes.
TEST(CheckpointErrors, EachChunkIsCheckedByTheDeviceThatReadsIt) {
  constexpr std::int64_t kRow = detail::kChecksumChunkBytes / 4;  // f32 elements per chunk
  TrainState whole;
  whole.params.set("w", Tensor::ones({3, kRow}));
  const std::string dir = scratch("chunks");
  const fs::path step_dir = save_checkpoint(dir, whole, {});
  const json index = json::parse(read_bytes(step_dir / "index.json"));
  ASSERT_EQ(index["tensors"]["params/w"]["blocks"][0]["crc32"].size(), 3u);
  auto load_on_3 = [&] {
    std::vector<std::string> errors(3);
    on_mesh(Mesh({3}, {"x"}), [&](DeviceContext& ctx) {
      const nn::ParamSpecs specs{{"w", mesh::P("x")}};
      TrainState state;
      state.params.set("w", Tensor::zeros({1, kRow}));
      try {
        load_checkpoint(dir, state, {&ctx, &specs, nullptr});
        EXPECT_EQ(state.params.at("w").to_vector<float>()[7], 1.f);
      } catch (const IoError& e) {
        errors[static_cast<std::size_t>(ctx.device())] = e.what();
      }
    });
    return errors;
  };
  for (const std::string& e : load_on_3())
    EXPECT_EQ(e, "");
  const fs::path shard = step_dir / "device_00000.safetensors";
  std::string b = read_bytes(shard);
  b[data_offset(shard, "params/w") + 2 * detail::kChecksumChunkBytes + 99] ^= 1;
  write_bytes(shard, b);
  for (const std::string& e : load_on_3())
    EXPECT_NE(e.find(std::string("\"") + shard.string() +
                     "\": tensor \"params/w\": checksum mismatch in bytes "
                     "[2097152, 3145728) of its data"),
              std::string::npos)
        << e;
}

TEST(CheckpointErrors, ZeroStateWithoutItsStrategy) {
  const GptRun run;
  std::string msg;
  const std::string dir = scratch("zero_without_strategy");
  on_mesh(Mesh({2, 1}, {"data", "model"}), [&](DeviceContext& ctx) {
    nn::ParamSpecs specs;
    TensorTree shards = run.model.init(Key::from_seed(1), &specs, &ctx);
    parallel::ZeroDataParallel zero(ctx, 1, "data", &specs);
    TrainState state = TrainState::create(shards, run.opt, Key{}, zero);
    try {
      save_checkpoint(dir, state, {&ctx, &specs, nullptr});
    } catch (const InvalidArgument& e) {
      if (ctx.device() == 0) msg = e.what();
    }
  });
  EXPECT_NE(msg.find("[save_checkpoint] optimizer state \"mu/blocks/0/attn/out/bias\" has shape "
                     "(16,) but its parameter has (32,): pass the strategy"),
            std::string::npos)
      << msg;
}

TEST(CheckpointErrors, NoCheckpointAndLeftovers) {
  const std::string empty = scratch("empty");
  EXPECT_FALSE(find_checkpoint(empty).has_value());
  EXPECT_NE(load_error(empty).find("no checkpoint in \"" + empty + "\""), std::string::npos)
      << load_error(empty);
  // A crashed save leaves step_<n>.tmp with a truncated file: never chosen, and replaced by
  // the next save of that step.
  const std::string dir = scratch("leftover");
  Small s;
  TrainState a = s.trained();
  save_checkpoint(dir, a, {});
  const fs::path tmp = fs::path(dir) / "step_00000010.tmp";
  fs::create_directories(tmp);
  const std::string b = read_bytes(fs::path(dir) / "step_00000003" / "device_00000.safetensors");
  write_bytes(tmp / "device_00000.safetensors", b.substr(0, b.size() / 2));
  EXPECT_EQ(*find_checkpoint(dir), (fs::path(dir) / "step_00000003").string());
  EXPECT_EQ(load_error(dir), "no error");
  a.step = 10;
  save_checkpoint(dir, a, {});
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(*find_checkpoint(dir), (fs::path(dir) / "step_00000010").string());
  EXPECT_EQ(load_error(dir), "no error");
}

TEST(CheckpointErrors, AnErrorOnOneDeviceIsRaisedOnEvery) {
  // Saved on (1, 2): the blocks of model column 1 are in device 1's file. Loaded on (2, 2)
  // without that file: only the devices of column 1 read it, but every device raises their
  // error (no device goes on alone to its next collective).
  const GptRun run;
  const std::string dir = scratch("one_device_error");
  gpt_on_mesh(run, Mesh({1, 2}, {"data", "model"}), Kind::DataParallel, "", 1, dir, 1);
  const fs::path step_dir = *find_checkpoint(dir);
  fs::remove(step_dir / "device_00001.safetensors");
  std::vector<std::string> errors(4);
  on_mesh(Mesh({2, 2}, {"data", "model"}), [&](DeviceContext& ctx) {
    nn::ParamSpecs specs;
    TensorTree shards = run.model.init(Key::from_seed(1), &specs, &ctx);
    TrainState state = TrainState::create(shards, run.opt, Key::from_seed(2));
    try {
      load_checkpoint(dir, state, {&ctx, &specs, nullptr});
    } catch (const IoError& e) {
      errors[static_cast<std::size_t>(ctx.device())] = e.what();
    }
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("cannot open \"" + (step_dir / "device_00001.safetensors").string()),
              std::string::npos)
        << e;
}

// ------------------------------------------------------------ Python's safetensors

// w (8, 6) = 0.5 * arange split over data x model, v (6,) replicated, ids (4,) i32, and the
// slot mu/w = 2 w, at step 5: the values read_checkpoint.py expects.
TrainState python_state(DeviceContext* ctx) {
  const int di = ctx ? ctx->axis_index("data") : 0, mi = ctx ? ctx->axis_index("model") : 0;
  const std::int64_t rows = ctx ? 4 : 8, cols = ctx ? 3 : 6;
  std::vector<float> wv(static_cast<std::size_t>(rows * cols)), muv(wv.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      wv[r * cols + c] = 0.5f * static_cast<float>((di * rows + r) * 6 + mi * cols + c);
  for (std::size_t i = 0; i < wv.size(); ++i)
    muv[i] = 2 * wv[i];
  const Tensor w = Tensor::from_vector(wv, {rows, cols});
  const Tensor mu = Tensor::from_vector(muv, {rows, cols});
  TrainState s;
  s.step = 5;
  s.rng = Key::from_seed(77);
  s.params.set("w", w);
  s.params.set("v", Tensor::from_vector<float>({-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f}, {6}));
  s.params.set("ids", Tensor::from_vector<std::int32_t>({7, 8, 9, 10}, {4}));
  s.opt_state.set("mu/w", mu);
  return s;
}

TEST(CheckpointPython, SafetensorsReadsTheShards) {
  const std::string python =
      distjax::testing::python_that_runs("import safetensors.numpy, numpy");
  if (python.empty()) {
    if (std::getenv("DISTJAX_REQUIRE_SAFETENSORS") != nullptr)
      FAIL() << "no Python with safetensors and numpy (DISTJAX_REQUIRE_SAFETENSORS is set): run "
                "scripts/setup_python.sh";
    GTEST_SKIP() << "no Python with safetensors and numpy: run scripts/setup_python.sh (makes "
                    ".venv-test) or set DISTJAX_PYTHON";
  }
  const std::string sharded = scratch("python_sharded"), whole = scratch("python_whole");
  on_mesh(Mesh({2, 2}, {"data", "model"}), [&](DeviceContext& ctx) {
    const nn::ParamSpecs specs{{"w", mesh::P("data", "model")}};
    save_checkpoint(sharded, python_state(&ctx), {&ctx, &specs, nullptr});
  });
  save_checkpoint(whole, python_state(nullptr), {});
  const std::string script = std::string(DISTJAX_SOURCE_DIR) + "/tests/train/read_checkpoint.py";
  const std::string cmd = "'" + python + "' '" + script + "' '" + *find_checkpoint(sharded) +
                          "' '" + *find_checkpoint(whole) + "' 2>&1";
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr)
    out += buf;
  const int status = ::pclose(pipe);
  EXPECT_EQ(status, 0) << cmd << "\n" << out;
  EXPECT_NE(out.find("ok: 4 tensors"), std::string::npos) << out;
}

}  // namespace
}  // namespace distjax::train
