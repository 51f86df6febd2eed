#include "distjax/train/checkpoint.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "distjax/core/error.hpp"
#include "distjax/mesh/named_sharding.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/train/detail/checkpoint_match.hpp"
#include "distjax/train/detail/checksum.hpp"
#include "distjax/train/detail/safetensors.hpp"
#include "distjax/train/strategy.hpp"

namespace distjax::train {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using tensor::Tensor;

namespace {

constexpr const char* kFormat = "distjax.checkpoint";
// Version 2 added the checksums ("checksum", and "crc32" in every block).
constexpr int kVersion = 2;
constexpr const char* kIndex = "index.json";
constexpr const char* kLatest = "latest";
using detail::kOptState;
using detail::kParams;

std::string step_dir_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

// The step of a directory name "step_<digits>", or -1.
std::int64_t step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5) return -1;
  for (std::size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(5));
}

std::string device_file_name(int device) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "device_%05d.safetensors", device);
  return buf;
}

// ---------------------------------------------------------------- errors on every device

// Runs `fn` on every device of the layout and meets: when it threw on some device, every
// device throws the first such device's error (same type, same message), so that no
// device goes on to a collective the failed one never reaches.
template <class Fn>
void on_every_device(const CheckpointLayout& layout, Fn&& fn) {
  if (layout.ctx == nullptr) {
    fn();
    return;
  }
  int code = 0;  // 0 ok, 1 IoError, 2 InvalidArgument, 3 ShardingError, 4 other
  std::string what;
  try {
    fn();
  } catch (const IoError& e) {
    code = 1, what = e.what();
  } catch (const InvalidArgument& e) {
    code = 2, what = e.what();
  } catch (const ShardingError& e) {
    code = 3, what = e.what();
  } catch (const std::exception& e) {
    code = 4, what = e.what();
  }
  constexpr std::int64_t kWords = 512;  // code + message, truncated to ~2 KB
  std::vector<std::int32_t> mine(kWords, 0), all;
  mine[0] = code;
  std::memcpy(mine.data() + 1, what.data(),
              std::min<std::size_t>(what.size(), (kWords - 1) * 4 - 1));
  comm::Communicator& world = layout.ctx->world();
  all.resize(static_cast<std::size_t>(kWords * world.size()));
  world.all_gather(mine.data(), all.data(), kWords, DType::I32);
  for (int d = 0; d < world.size(); ++d) {
    const std::int32_t* m = all.data() + d * kWords;
    if (m[0] == 0) continue;
    const std::string msg(reinterpret_cast<const char*>(m + 1));
    switch (m[0]) {
      case 1:
        throw IoError(msg);
      case 2:
        throw InvalidArgument(msg);
      case 3:
        throw ShardingError(msg);
      default:
        throw Error(msg);
    }
  }
}

// ---------------------------------------------------------------- layout of a leaf

int device_of(const CheckpointLayout& l) {
  return l.ctx ? l.ctx->device() : 0;
}

// The spec of a state leaf: "params/<path>" takes the parameter's, "opt_state/<slot>/<path>"
// too. Without a mesh every leaf is whole.
mesh::PartitionSpec spec_of(const CheckpointLayout& l, const std::string& name) {
  if (l.ctx == nullptr || l.specs == nullptr) return {};
  const std::string path = detail::param_path(name);
  if (path.empty()) return {};
  auto it = l.specs->find(path);
  return it == l.specs->end() ? mesh::PartitionSpec() : it->second;
}

// The global shape of a local leaf and the [begin, end) box this device holds.
struct Placement {
  Shape global;
  Shape begin, end;
};

Placement place(const CheckpointLayout& l, const mesh::PartitionSpec& spec, const Shape& local,
                const std::string& name) {
  Placement p;
  if (l.ctx == nullptr) {
    p.global = local;
    p.begin.assign(local.size(), 0);
    p.end = local;
    return p;
  }
  const mesh::NamedSharding s(l.ctx->mesh(), spec);
  p.global = s.global_shape(local);
  s.validate(p.global, "checkpoint", name);
  for (const auto& [b, e] : s.shard_range(p.global, l.ctx->device())) {
    p.begin.push_back(b);
    p.end.push_back(e);
  }
  return p;
}

// The named leaves of a state: "params/..." then "opt_state/..." (the latter in the layout
// of the parameters).
std::vector<std::pair<std::string, Tensor>> named_leaves(const TensorTree& params,
                                                         const TensorTree& opt_state) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [path, t] : params)
    out.emplace_back(kParams + path, t);
  for (const auto& [path, t] : opt_state) {
    // A slot must have its parameter's shape by now; flat chunks mean that the strategy
    // that keeps them (ZeRO) was not given.
    const auto slash = path.find('/');
    const std::string param = slash == std::string::npos ? "" : path.substr(slash + 1);
    DISTJAX_CHECK(!params.contains(param) || params.at(param).shape() == t.shape(), InvalidArgument,
                  "[save_checkpoint] optimizer state \"", path, "\" has shape ",
                  to_string(t.shape()), " but its parameter has ",
                  to_string(params.at(param).shape()),
                  ": pass the strategy that keeps the state (e.g. ZeroDataParallel) in "
                  "CheckpointLayout::strategy");
    out.emplace_back(kOptState + path, t);
  }
  return out;
}

TensorTree opt_state_in_param_layout(const CheckpointLayout& l, const TrainState& state) {
  return l.strategy ? l.strategy->opt_state_to_param_layout(state.opt_state, state.params)
                    : state.opt_state;
}

// ---------------------------------------------------------------- the index

json spec_json(const mesh::PartitionSpec& spec) {
  json out = json::array();
  for (const auto& e : spec.entries())
    out.push_back(e.axes);
  return out;
}

mesh::PartitionSpec spec_from_json(const json& j) {
  std::vector<mesh::PartitionSpec::Entry> entries;
  for (const auto& e : j)
    entries.emplace_back(e.get<std::vector<std::string>>());
  return mesh::PartitionSpec::from_entries(std::move(entries));
}

// What a device holds of one leaf: the descriptors the devices exchange before a save.
struct Held {
  std::string name;
  Shape global, offset, shape;  // global shape; this device's block: offset and shape
  DType dtype = DType::F32;
  mesh::PartitionSpec spec;
};

std::vector<Held> describe(const CheckpointLayout& l,
                           const std::vector<std::pair<std::string, Tensor>>& leaves) {
  std::vector<Held> out;
  for (const auto& [name, t] : leaves) {
    const mesh::PartitionSpec spec = spec_of(l, name);
    const Placement p = place(l, spec, t.shape(), name);
    out.push_back({name, p.global, p.begin, t.shape(), t.dtype(), spec});
  }
  return out;
}

json held_json(const std::vector<Held>& held) {
  json out = json::array();
  for (const Held& h : held)
    out.push_back({h.name, h.global, h.offset, h.shape, dtype_name(h.dtype), spec_json(h.spec)});
  return out;
}

std::vector<Held> held_from_json(const json& j) {
  std::vector<Held> out;
  for (const auto& e : j)
    out.push_back({e[0].get<std::string>(), e[1].get<Shape>(), e[2].get<Shape>(), e[3].get<Shape>(),
                   dtype_from_name(e[4].get<std::string>()), spec_from_json(e[5])});
  return out;
}

// Every device's `mine`, by device (an all_gather of the JSON texts; one device: its own).
// A collective.
std::vector<json> gather_json(const CheckpointLayout& l, const json& mine) {
  if (l.ctx == nullptr) return {mine};
  comm::Communicator& world = l.ctx->world();
  const int n = world.size();
  const std::string text = mine.dump();
  std::int64_t len = static_cast<std::int64_t>(text.size()), max_len = len;
  world.all_reduce(&len, &max_len, 1, DType::I64, comm::ReduceOp::Max);
  const std::int64_t words = max_len / 4 + 1;  // text, NUL-padded, as i32 words
  std::vector<std::int32_t> send(static_cast<std::size_t>(words), 0),
      all(static_cast<std::size_t>(words * n));
  std::memcpy(send.data(), text.data(), text.size());
  world.all_gather(send.data(), all.data(), words, DType::I32);
  std::vector<json> out;
  for (int d = 0; d < n; ++d)
    out.push_back(json::parse(reinterpret_cast<const char*>(all.data() + d * words)));
  return out;
}

// Every device's descriptors, by device. Devices may hold different leaves (pipeline
// stages hold different layers).
std::vector<std::vector<Held>> exchange_held(const CheckpointLayout& l,
                                             const std::vector<Held>& mine) {
  std::vector<std::vector<Held>> out;
  for (const json& j : gather_json(l, held_json(mine)))
    out.push_back(held_from_json(j));
  return out;
}

// One tensor of a save: its blocks, each written by the lowest device holding it (a block
// replicated along some mesh axes is written once).
struct Planned {
  Shape global, block_shape;
  DType dtype = DType::F32;
  mesh::PartitionSpec spec;
  std::vector<std::pair<Shape, int>> blocks;  // offset, writing device
};

// The same plan on every device (computed from every device's descriptors). Throws
// InvalidArgument when devices disagree on a tensor or its blocks do not tile it.
std::map<std::string, Planned> plan_save(const std::vector<std::vector<Held>>& all) {
  std::map<std::string, Planned> plan;
  for (int d = 0; d < static_cast<int>(all.size()); ++d) {
    for (const Held& h : all[static_cast<std::size_t>(d)]) {
      auto [it, fresh] = plan.try_emplace(h.name);
      Planned& p = it->second;
      if (fresh) {
        p = {h.global, h.shape, h.dtype, h.spec, {}};
      } else {
        DISTJAX_CHECK(p.global == h.global && p.block_shape == h.shape && p.dtype == h.dtype &&
                          p.spec == h.spec,
                      InvalidArgument, "[save_checkpoint] devices disagree on \"", h.name,
                      "\": device ", d, " holds ", dtype_name(h.dtype), " ", to_string(h.global),
                      " ", h.spec.to_string(), " in blocks ", to_string(h.shape),
                      ", a lower device ", dtype_name(p.dtype), " ", to_string(p.global), " ",
                      p.spec.to_string(), " in blocks ", to_string(p.block_shape));
      }
      const bool known = std::any_of(p.blocks.begin(), p.blocks.end(),
                                     [&](const auto& b) { return b.first == h.offset; });
      if (!known) p.blocks.emplace_back(h.offset, d);
    }
  }
  for (const auto& [name, p] : plan)
    DISTJAX_CHECK(
        static_cast<std::int64_t>(p.blocks.size()) * numel(p.block_shape) == numel(p.global),
        InvalidArgument, "[save_checkpoint] the devices hold ", p.blocks.size(),
        " distinct blocks ", to_string(p.block_shape), " of \"", name, "\" ", to_string(p.global),
        ": not the whole array");
  return plan;
}

// Whether `device` writes its block of `name`.
bool writes(const std::map<std::string, Planned>& plan, const std::string& name, int device) {
  for (const auto& b : plan.at(name).blocks)
    if (b.second == device) return true;
  return false;
}

json make_index(const CheckpointLayout& l, const TrainState& state,
                const std::map<std::string, Planned>& plan, const SaveOptions& options) {
  json index;
  index["format"] = kFormat;
  index["version"] = kVersion;
  index["step"] = state.step;
  index["rng"] = {state.rng.words[0], state.rng.words[1]};
  index["data_position"] = {{"epoch", options.data.epoch}, {"batch", options.data.batch}};
  if (const auto& ls = state.loss_scale)
    index["loss_scale"] = {{"scale", ls->scale},
                           {"growth_factor", ls->growth_factor},
                           {"backoff_factor", ls->backoff_factor},
                           {"growth_interval", ls->growth_interval},
                           {"min_scale", ls->min_scale},
                           {"good_steps", ls->good_steps},
                           {"skipped_steps", ls->skipped_steps}};
  json mesh_j = {{"shape", json::array()}, {"axis_names", json::array()}};
  if (l.ctx)
    mesh_j = {{"shape", l.ctx->mesh().shape()}, {"axis_names", l.ctx->mesh().axis_names()}};
  index["mesh"] = mesh_j;
  index["checksum"] = {{"algorithm", "crc32"}, {"chunk_bytes", detail::kChecksumChunkBytes}};
  try {
    index["config"] = json::parse(options.config.empty() ? "{}" : options.config);
  } catch (const json::exception& e) {
    DISTJAX_THROW(InvalidArgument,
                  "[save_checkpoint] SaveOptions::config is not valid JSON: ", e.what());
  }
  std::set<int> writers;
  json tensors = json::object();
  for (const auto& [name, p] : plan) {
    json blocks = json::array();
    for (const auto& [offset, d] : p.blocks) {
      writers.insert(d);
      blocks.push_back({{"file", device_file_name(d)},
                        {"offset", offset},
                        {"shape", p.block_shape},
                        {"crc32", json::array()}});  // filled by add_checksums
    }
    tensors[name] = {{"shape", p.global},
                     {"dtype", dtype_name(p.dtype)},
                     {"spec", spec_json(p.spec)},
                     {"blocks", blocks}};
  }
  json files = json::array();
  for (int d : writers)
    files.push_back(device_file_name(d));
  index["files"] = files;
  index["tensors"] = tensors;
  return index;
}

// Main device: each block's checksums (`sums`: by device, tensor name -> CRC-32 per chunk),
// from the device that wrote it.
void add_checksums(json& index, const std::map<std::string, Planned>& plan,
                   const std::vector<json>& sums) {
  for (const auto& [name, p] : plan)
    for (std::size_t i = 0; i < p.blocks.size(); ++i)
      index["tensors"][name]["blocks"][i]["crc32"] =
          sums.at(static_cast<std::size_t>(p.blocks[i].second)).at(name);
}

// The index as text: one line per top-level field and one per tensor (readable, and a
// diff between two steps shows the tensors that changed layout).
std::string index_text(const json& index) {
  std::string out = "{\n";
  bool first = true;
  for (const auto& [key, value] : index.items()) {
    out += first ? " " : ",\n ";
    first = false;
    out += json(key).dump() + ": ";
    if (key != "tensors") {
      out += value.dump();
      continue;
    }
    out += "{";
    bool first_tensor = true;
    for (const auto& [name, t] : value.items()) {
      out += first_tensor ? "\n  " : ",\n  ";
      first_tensor = false;
      out += json(name).dump() + ": " + t.dump();
    }
    out += "\n }";
  }
  return out + "\n}\n";
}

// Keeps the `keep` newest complete step directories of `dir`.
void prune(const std::string& dir, int keep) {
  if (keep <= 0) return;
  std::vector<std::pair<std::int64_t, fs::path>> steps;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && step_of(e.path().filename().string()) >= 0)
      steps.emplace_back(step_of(e.path().filename().string()), e.path());
  std::sort(steps.begin(), steps.end());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < steps.size(); ++i)
    fs::remove_all(steps[i].second);
}

// Main device: makes the temporary directory `tmp` (removing a crashed save's leftover).
void prepare_tmp(const std::string& dir, const std::string& tmp) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  DISTJAX_CHECK(!ec, IoError, "[save_checkpoint] cannot create \"", dir, "\": ", ec.message());
  fs::remove_all(tmp, ec);
  DISTJAX_CHECK(!ec, IoError, "[save_checkpoint] cannot remove the leftover \"", tmp,
                "\": ", ec.message());
  fs::create_directory(tmp, ec);
  DISTJAX_CHECK(!ec, IoError, "[save_checkpoint] cannot create \"", tmp, "\": ", ec.message());
}

// Main device: index, rename into place, `latest`, pruning.
void commit(const std::string& dir, const std::string& tmp, const std::string& final_dir,
            const json& index, const SaveOptions& options) {
  detail::write_file_atomic((fs::path(tmp) / kIndex).string(), index_text(index));
  detail::fsync_dir(tmp);
  if (options.fault_hook) options.fault_hook("index_written");
  std::error_code ec;
  const std::string old = final_dir + ".old";
  if (fs::exists(final_dir)) {  // the same step saved again (e.g. after a resume): swap
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    DISTJAX_CHECK(!ec, IoError, "[save_checkpoint] cannot move \"", final_dir,
                  "\" aside: ", ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  DISTJAX_CHECK(!ec, IoError, "[save_checkpoint] cannot rename \"", tmp, "\" to \"", final_dir,
                "\": ", ec.message());
  detail::fsync_dir(dir);
  fs::remove_all(old, ec);
  if (options.fault_hook) options.fault_hook("renamed");
  detail::write_file_atomic((fs::path(dir) / kLatest).string(),
                            fs::path(final_dir).filename().string() + "\n");
  prune(dir, options.keep_last);
}

}  // namespace

// ---------------------------------------------------------------- save

std::string save_checkpoint(const std::string& dir, const TrainState& state,
                            const CheckpointLayout& layout, const SaveOptions& options) {
  const int device = device_of(layout);
  const std::string final_dir = (fs::path(dir) / step_dir_name(state.step)).string();
  const std::string tmp = final_dir + ".tmp";
  // A collective for ZeRO, so before anything that may fail on one device only.
  const TensorTree opt_state = opt_state_in_param_layout(layout, state);
  std::vector<std::pair<std::string, Tensor>> leaves;
  std::vector<Held> held;
  on_every_device(layout, [&] {
    leaves = named_leaves(state.params, opt_state);
    held = describe(layout, leaves);
  });
  const std::vector<std::vector<Held>> all = exchange_held(layout, held);
  std::map<std::string, Planned> plan;
  json index;
  on_every_device(layout, [&] {
    plan = plan_save(all);
    if (device == 0) {
      index = make_index(layout, state, plan, options);
      prepare_tmp(dir, tmp);
    }
  });
  json sums = json::object();  // of this device's blocks: name -> CRC-32 per chunk
  on_every_device(layout, [&] {
    // The host's copies of the blocks this device writes (no copy on the CPU).
    std::vector<std::pair<std::string, Tensor>> mine;
    for (const auto& [name, t] : leaves)
      if (writes(plan, name, device)) mine.emplace_back(name, t.to(Device::cpu()));
    for (const auto& [name, t] : mine)
      sums[name] = detail::chunk_crc32(t.raw_data(), t.nbytes(), detail::kChecksumChunkBytes);
    if (!mine.empty())
      detail::write_safetensors((fs::path(tmp) / device_file_name(device)).string(), mine,
                                {{"format", "distjax"},
                                 {"device", std::to_string(device)},
                                 {"step", std::to_string(state.step)}});
    if (options.fault_hook) options.fault_hook("shards_written");
  });
  const std::vector<json> all_sums = gather_json(layout, sums);
  on_every_device(layout, [&] {
    if (device != 0) return;
    add_checksums(index, plan, all_sums);
    commit(dir, tmp, final_dir, index, options);
  });
  return final_dir;
}

// ---------------------------------------------------------------- find and index

std::optional<std::string> find_checkpoint(const std::string& dir) {
  const fs::path d(dir);
  if (fs::exists(d / kIndex)) return dir;
  if (!fs::is_directory(d)) return std::nullopt;
  // The newest complete step directory. `latest` names it too, except in the moment between
  // a save's rename and its update of `latest`: the directories are the truth.
  std::int64_t best = -1;
  fs::path best_path;
  for (const auto& e : fs::directory_iterator(d)) {
    const std::int64_t s = step_of(e.path().filename().string());
    if (e.is_directory() && s > best && fs::exists(e.path() / kIndex))
      best = s, best_path = e.path();
  }
  if (best < 0) return std::nullopt;
  return best_path.string();
}

CheckpointIndex read_checkpoint_index(const std::string& path) {
  const auto found = find_checkpoint(path);
  DISTJAX_CHECK(found.has_value(), IoError, "[load_checkpoint] no checkpoint in \"", path,
                "\": no ", kIndex, ", no \"", kLatest, "\" and no complete step_<n> directory");
  const std::string file = (fs::path(*found) / kIndex).string();
  CheckpointIndex out =
      parse_checkpoint_index(detail::read_text_file(file, "load_checkpoint"), file);
  out.meta.path = *found;
  // A step directory holds its own step: a copied or edited index is not taken for another.
  fs::path step_dir = fs::path(*found).lexically_normal();
  if (!step_dir.has_filename()) step_dir = step_dir.parent_path();
  const std::int64_t dir_step = step_of(step_dir.filename().string());
  DISTJAX_CHECK(dir_step < 0 || dir_step == out.meta.step, IoError, "[load_checkpoint] \"", file,
                "\" says step ", out.meta.step, " but its directory is ",
                step_dir.filename().string());
  return out;
}

namespace {

// Every number of an index is an integer but the loss scale's factors and what the run's config
// holds: a float read as an integer is undefined (a chunk_bytes of 1e21 was).
void check_integers(const json& j, const std::string& where, const std::string& file) {
  DISTJAX_CHECK(!j.is_number_float(), IoError, "[load_checkpoint] \"", file, "\": ", where,
                " must be an integer, got ", j.dump());
  if (!j.is_structured()) return;
  for (const auto& [k, v] : j.items()) {
    const bool any_number =
        (where.empty() && k == "config") || (where == "loss_scale" && k != "growth_interval" &&
                                             k != "good_steps" && k != "skipped_steps");
    if (!any_number) check_integers(v, where.empty() ? k : where + "." + k, file);
  }
}

// A block lies inside its tensor: the same rank, offset >= 0 and offset + shape <= the
// tensor's shape in every dimension (so no sum of them overflows later).
void check_block(const CheckpointBlock& b, const CheckpointTensor& t, const std::string& file) {
  bool inside = b.offset.size() == t.shape.size() && b.shape.size() == t.shape.size();
  for (std::size_t i = 0; inside && i < t.shape.size(); ++i)
    inside = b.offset[i] >= 0 && b.shape[i] >= 0 && b.shape[i] <= t.shape[i] &&
             b.offset[i] <= t.shape[i] - b.shape[i];
  DISTJAX_CHECK(inside, IoError, "[load_checkpoint] \"", file, "\": a block of \"", t.name,
                "\" in ", b.file, " at offset ", to_string(b.offset), " with shape ",
                to_string(b.shape), " is not inside the tensor's shape ", to_string(t.shape));
}

}  // namespace

CheckpointIndex parse_checkpoint_index(const std::string& text, const std::string& file) {
  CheckpointIndex out;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    DISTJAX_THROW(IoError, "[load_checkpoint] \"", file, "\": not valid JSON: ", e.what());
  }
  check_integers(j, "", file);
  try {
    DISTJAX_CHECK(j.value("format", "") == kFormat, IoError, "[load_checkpoint] \"", file,
                  "\": not a DistJax checkpoint index (format is not \"", kFormat, "\")");
    const int version = j.at("version").get<int>();
    DISTJAX_CHECK(version == kVersion, IoError, "[load_checkpoint] \"", file, "\": version ",
                  version, " is not supported: this build reads version ", kVersion,
                  version < kVersion ? " (version 1 has no checksums of the data)" : "");
    out.meta.step = j.at("step").get<std::int64_t>();
    const auto rng = j.at("rng").get<std::vector<std::uint32_t>>();
    DISTJAX_CHECK(rng.size() == 2, IoError, "[load_checkpoint] \"", file,
                  "\": rng must hold 2 words");
    out.meta.rng.words = {rng[0], rng[1]};
    out.meta.data = {j.at("data_position").at("epoch").get<std::int64_t>(),
                     j.at("data_position").at("batch").get<std::int64_t>()};
    out.meta.config = j.at("config").dump();
    if (j.contains("loss_scale")) {
      const json& ls = j.at("loss_scale");
      out.meta.loss_scale =
          DynamicLossScale{.scale = ls.at("scale").get<double>(),
                           .growth_factor = ls.at("growth_factor").get<double>(),
                           .backoff_factor = ls.at("backoff_factor").get<double>(),
                           .growth_interval = ls.at("growth_interval").get<std::int64_t>(),
                           .min_scale = ls.at("min_scale").get<double>(),
                           .good_steps = ls.at("good_steps").get<std::int64_t>(),
                           .skipped_steps = ls.at("skipped_steps").get<std::int64_t>()};
    }
    out.mesh_shape = j.at("mesh").at("shape").get<std::vector<int>>();
    out.mesh_axis_names = j.at("mesh").at("axis_names").get<std::vector<std::string>>();
    if (!out.mesh_shape.empty() || !out.mesh_axis_names.empty()) {
      try {
        mesh::Mesh(out.mesh_shape, out.mesh_axis_names);
      } catch (const ShardingError& e) {
        DISTJAX_THROW(IoError, "[load_checkpoint] \"", file, "\": mesh: ", e.what());
      }
    }
    out.files = j.at("files").get<std::vector<std::string>>();
    const json& checksum = j.at("checksum");
    DISTJAX_CHECK(checksum.at("algorithm").get<std::string>() == "crc32", IoError,
                  "[load_checkpoint] \"", file, "\": checksum algorithm ",
                  checksum.at("algorithm").dump(),
                  " is not supported (this build reads \"crc32\")");
    out.checksum_chunk_bytes = checksum.at("chunk_bytes").get<std::uint64_t>();
    DISTJAX_CHECK(out.checksum_chunk_bytes > 0, IoError, "[load_checkpoint] \"", file,
                  "\": checksum chunk_bytes must be positive");
    for (const auto& [name, t] : j.at("tensors").items()) {
      CheckpointTensor ct;
      ct.name = name;
      ct.shape = t.at("shape").get<Shape>();
      ct.dtype = dtype_from_name(t.at("dtype").get<std::string>());
      ct.spec = spec_from_json(t.at("spec"));
      DISTJAX_CHECK(detail::tensor_bytes(ct.shape, dtype_size(ct.dtype)), IoError,
                    "[load_checkpoint] \"", file, "\": tensor \"", name, "\" has shape ",
                    to_string(ct.shape), ", which no tensor can have");
      for (const auto& b : t.at("blocks")) {
        CheckpointBlock block{b.at("file").get<std::string>(), b.at("offset").get<Shape>(),
                              b.at("shape").get<Shape>(),
                              b.at("crc32").get<std::vector<std::uint32_t>>()};
        check_block(block, ct, file);
        const std::uint64_t bytes = *detail::tensor_bytes(block.shape, dtype_size(ct.dtype));
        const std::uint64_t chunks = detail::num_chunks(bytes, out.checksum_chunk_bytes);
        DISTJAX_CHECK(block.crc32.size() == chunks, IoError, "[load_checkpoint] \"", file,
                      "\": a block of \"", name, "\" in ", block.file, " has ", block.crc32.size(),
                      " checksums; its ", bytes, " bytes need ", chunks);
        ct.blocks.push_back(std::move(block));
      }
      out.tensors.push_back(std::move(ct));
    }
  } catch (const json::exception& e) {
    DISTJAX_THROW(IoError, "[load_checkpoint] \"", file,
                  "\": missing or malformed field: ", e.what());
  } catch (const InvalidArgument& e) {  // dtype_from_name
    DISTJAX_THROW(IoError, "[load_checkpoint] \"", file, "\": ", e.what());
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

// ---------------------------------------------------------------- load

namespace {

// Copies the part of `block` (in `file`) that overlaps `box` into `dst` (the box's tensor).
void read_overlap(const detail::SafetensorsReader& file, const CheckpointTensor& t,
                  const CheckpointBlock& block, std::uint64_t chunk_bytes, const Placement& box,
                  Tensor& dst, std::int64_t* copied) {
  const std::size_t r = t.shape.size();
  Shape lo(r), hi(r);
  for (std::size_t i = 0; i < r; ++i) {
    lo[i] = std::max(box.begin[i], block.offset[i]);
    hi[i] = std::min(box.end[i], block.offset[i] + block.shape[i]);
    if (lo[i] >= hi[i]) return;
  }
  detail::CheckedReads data(file, file.entry(t.name, t.dtype, block.shape), t.name, block.crc32,
                            chunk_bytes);
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(t.dtype));
  const Shape dst_shape = dst.shape();
  const auto bstride = contiguous_strides(block.shape), dstride = contiguous_strides(dst_shape);
  // One read covers the innermost dimensions the overlap spans whole in both the block and
  // the destination, plus the next one out.
  std::size_t k = r;  // dims [k, r) are read in one run
  std::int64_t run = 1;
  while (k > 0) {
    const std::size_t i = k - 1;
    run *= hi[i] - lo[i];
    k = i;
    const bool whole = lo[i] == block.offset[i] && hi[i] - lo[i] == block.shape[i] &&
                       lo[i] == box.begin[i] && hi[i] - lo[i] == dst_shape[i];
    if (!whole) break;
  }
  Shape idx(lo.begin(), lo.begin() + static_cast<std::ptrdiff_t>(k));  // odometer over dims [0, k)
  char* out = static_cast<char*>(dst.raw_data());
  while (true) {
    std::int64_t src = 0, to = 0;
    for (std::size_t i = 0; i < r; ++i) {
      const std::int64_t g = i < k ? idx[i] : lo[i];
      src += (g - block.offset[i]) * bstride[i];
      to += (g - box.begin[i]) * dstride[i];
    }
    data.read(static_cast<std::uint64_t>(src * es), out + to * es,
              static_cast<std::uint64_t>(run * es));
    *copied += run;
    std::size_t i = k;
    for (; i > 0; --i) {
      if (++idx[i - 1] < hi[i - 1]) break;
      idx[i - 1] = lo[i - 1];
    }
    if (i == 0) return;
  }
}

// The names of the state's leaves on every device ("params/...", "opt_state/..."): devices
// may hold different leaves (pipeline stages), and the checkpoint must match their union.
// A collective.
std::set<std::string> state_names(const CheckpointLayout& l, const TensorTree& params,
                                  const TensorTree& opt_state) {
  json mine = json::array();
  for (const auto& [path, t] : params)
    mine.push_back(kParams + path);
  for (const auto& [path, t] : opt_state)
    mine.push_back(kOptState + path);
  std::set<std::string> out;
  for (const json& names : gather_json(l, mine))
    for (const auto& n : names)
      out.insert(n.get<std::string>());
  return out;
}

// Fills every leaf of `tree` (names `prefix` + path) from the checkpoint.
TensorTree fill(const CheckpointLayout& l, const CheckpointIndex& index, const TensorTree& tree,
                const std::string& prefix,
                std::map<std::string, std::unique_ptr<detail::SafetensorsReader>>& files) {
  std::map<std::string, const CheckpointTensor*> by_name;
  for (const auto& t : index.tensors)
    by_name[t.name] = &t;
  const std::string where = (fs::path(index.meta.path) / kIndex).string();
  TensorTree out;
  for (const auto& [path, leaf] : tree) {
    const std::string name = prefix + path;
    auto it = by_name.find(name);
    DISTJAX_CHECK(it != by_name.end(), InvalidArgument, "[load_checkpoint] \"", where,
                  "\" has no tensor \"", name, "\" (the state being loaded has it)");
    const CheckpointTensor& t = *it->second;
    const Placement box = place(l, spec_of(l, name), leaf.shape(), name);
    DISTJAX_CHECK(t.shape == box.global && t.dtype == leaf.dtype(), InvalidArgument,
                  "[load_checkpoint] tensor \"", name, "\" in \"", where, "\" is ",
                  dtype_name(t.dtype), " ", to_string(t.shape), "; the state being loaded has ",
                  dtype_name(leaf.dtype()), " ", to_string(box.global));
    // Read on the host, then handed to the current device with one copy.
    Tensor dst = Tensor::empty(leaf.shape(), leaf.dtype(), Device::cpu());
    dst.set_varying_axes(leaf.varying_axes());
    std::int64_t copied = 0;
    for (const CheckpointBlock& b : t.blocks) {
      DISTJAX_CHECK(b.offset.size() == t.shape.size() && b.shape.size() == t.shape.size(), IoError,
                    "[load_checkpoint] \"", where, "\": a block of \"", name,
                    "\" does not have the tensor's rank");
      auto& reader = files[b.file];
      if (!reader)
        reader = std::make_unique<detail::SafetensorsReader>(
            (fs::path(index.meta.path) / b.file).string(), "load_checkpoint");
      read_overlap(*reader, t, b, index.checksum_chunk_bytes, box, dst, &copied);
    }
    DISTJAX_CHECK(copied == dst.numel(), IoError, "[load_checkpoint] \"", where,
                  "\": the blocks of \"", name, "\" cover ", copied, " of the ", dst.numel(),
                  " elements this device needs (overlapping or missing blocks)");
    out.set(path, dst.to(current_device()));
  }
  return out;
}

}  // namespace

CheckpointMeta load_checkpoint(const std::string& path, TrainState& state,
                               const CheckpointLayout& layout, const LoadOptions& options) {
  // ZeRO's conversion and the exchange of names are collectives: done first, so that no
  // device skips them.
  const TensorTree opt_target = opt_state_in_param_layout(layout, state);
  const std::set<std::string> names = state_names(layout, state.params, opt_target);
  CheckpointMeta meta;
  TensorTree params, opt_state;
  on_every_device(layout, [&] {
    const CheckpointIndex index = read_checkpoint_index(path);
    std::vector<std::string> saved;
    for (const CheckpointTensor& t : index.tensors)
      saved.push_back(t.name);
    detail::check_match(index.meta.path, saved, names, options.drop);
    std::map<std::string, std::unique_ptr<detail::SafetensorsReader>> files;
    params = fill(layout, index, state.params, kParams, files);
    opt_state = fill(layout, index, opt_target, kOptState, files);
    meta = index.meta;
  });
  state.params = std::move(params);
  state.opt_state = layout.strategy
                        ? layout.strategy->opt_state_from_param_layout(opt_state, state.params)
                        : std::move(opt_state);
  state.step = meta.step;
  state.rng = meta.rng;
  // A checkpoint without a loss scale leaves the state's own (a bf16 run resumed as f16
  // starts a fresh scale).
  if (meta.loss_scale) state.loss_scale = meta.loss_scale;
  return meta;
}

// ---------------------------------------------------------------- remove

void remove_checkpoints(const std::string& dir, const CheckpointLayout& layout) {
  on_every_device(layout, [&] {
    if (device_of(layout) != 0 || !fs::is_directory(dir)) return;
    // `latest` first: it never names a directory that is gone while others remain.
    std::vector<fs::path> doomed;
    for (const char* name : {kLatest, "latest.tmp"})
      if (fs::exists(fs::path(dir) / name)) doomed.push_back(fs::path(dir) / name);
    for (const auto& e : fs::directory_iterator(dir)) {
      const fs::path name = e.path().filename();
      const bool aside = name.extension() == ".tmp" || name.extension() == ".old";
      if (e.is_directory() && step_of((aside ? name.stem() : name).string()) >= 0)
        doomed.push_back(e.path());
    }
    for (const fs::path& p : doomed) {
      std::error_code ec;
      fs::remove_all(p, ec);
      DISTJAX_CHECK(!ec, IoError, "[remove_checkpoints] cannot remove \"", p.string(),
                    "\": ", ec.message());
    }
    detail::fsync_dir(dir);
  });
}

// ---------------------------------------------------------------- inspect

void inspect_checkpoint(const std::string& path, std::ostream& os) {
  print_checkpoint_index(read_checkpoint_index(path), os);
}

void print_checkpoint_index(const CheckpointIndex& index, std::ostream& os) {
  os << "checkpoint " << index.meta.path << "\n";
  os << "step " << index.meta.step << ", rng [" << index.meta.rng.words[0] << ", "
     << index.meta.rng.words[1] << "], data position epoch " << index.meta.data.epoch << " batch "
     << index.meta.data.batch << "\n";
  if (const auto& ls = index.meta.loss_scale)
    os << "loss scale " << ls->scale << " (" << ls->good_steps << " good steps, "
       << ls->skipped_steps << " skipped)\n";
  os << "mesh ";
  if (index.mesh_shape.empty())
    os << "(one device)";
  else
    os << mesh::Mesh(index.mesh_shape, index.mesh_axis_names).describe();
  os << ", " << index.files.size() << " files, " << index.tensors.size() << " tensors\n";
  // One row per tensor, in columns.
  std::vector<std::array<std::string, 5>> rows{{"tensor", "shape", "dtype", "spec", "blocks"}};
  for (const auto& t : index.tensors) {
    std::vector<std::string> files;
    for (const auto& b : t.blocks)
      if (std::find(files.begin(), files.end(), b.file) == files.end()) files.push_back(b.file);
    std::string where = std::to_string(t.blocks.size()) + " in ";
    for (std::size_t i = 0; i < files.size(); ++i)
      where += (i ? ", " : "") + files[i];
    rows.push_back({t.name, to_string(t.shape), dtype_name(t.dtype), t.spec.to_string(), where});
  }
  std::array<std::size_t, 5> w{};
  for (const auto& r : rows)
    for (std::size_t c = 0; c < r.size(); ++c)
      w[c] = std::max(w[c], r[c].size());
  for (const auto& r : rows) {
    for (std::size_t c = 0; c + 1 < r.size(); ++c)
      os << r[c] << std::string(w[c] + 2 - r[c].size(), ' ');
    os << r.back() << "\n";
  }
}

}  // namespace distjax::train
