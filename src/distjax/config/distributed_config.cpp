// DistributedConfig: resolution from the launch environment, the validation rules, the mesh.
#include "distjax/config/distributed_config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda.hpp"

namespace distjax::config {
namespace {

std::string join(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i)
    os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::string join(const std::vector<std::string>& v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i)
    os << (i ? ", " : "") << '"' << v[i] << '"';
  os << "]";
  return os.str();
}

// Devices of a mesh shape, or of tp x pp, kept within +-(INT_MAX + 1): beyond that no run
// has as many devices (world_size is an int), and the product of a file's sizes cannot
// overflow (3 sizes of 2^31 - 1 overflowed int64 before).
constexpr std::int64_t kTooManyDevices = std::int64_t{std::numeric_limits<int>::max()} + 1;
std::int64_t product(const std::vector<int>& v) {
  std::int64_t p = 1;
  for (int x : v)
    p = std::clamp(p * x, -kTooManyDevices, kTooManyDevices);
  return p;
}

// Messages are built with a stream: "world_size = 6 must equal ...".
template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// The rules on sizes that every other rule needs (a size <= 0 makes the rest meaningless).
void size_rules(const DistributedConfig& c, std::vector<std::string>& out) {
  const std::pair<const char*, int> sizes[] = {
      {"world_size", c.world_size},
      {"num_nodes", c.num_nodes},
      {"num_processes_per_node", c.num_processes_per_node},
      {"tensor_parallel_size", c.tensor_parallel_size},
      {"pipeline_parallel_size", c.pipeline_parallel_size},
      {"context_parallel_size", c.context_parallel_size}};
  for (const auto& [name, v] : sizes) {
    if (v >= 1) continue;
    if (v == 0 && std::string_view(name) == "num_processes_per_node" && c.world_size >= 1 &&
        c.num_nodes >= 1)  // left 0 by resolve(): world_size does not split evenly
      out.push_back(str("num_processes_per_node cannot be derived: world_size = ", c.world_size,
                        " is not divisible by num_nodes = ", c.num_nodes));
    else
      out.push_back(str(name, " = ", v, " must be positive"));
  }
  if (c.rank < 0) out.push_back(str("rank = ", c.rank, " must not be negative"));
  if (c.local_rank < 0) out.push_back(str("local_rank = ", c.local_rank, " must not be negative"));
  if (c.master_port < 1 || c.master_port > 65535)
    out.push_back(str("master_port = ", c.master_port, " must be in 1..65535"));
  if (c.master_addr.empty()) out.push_back("master_addr must not be empty");
  if (!(c.timeout_s >= 0.001 && c.timeout_s <= 86400.0))  // NaN fails too
    out.push_back(str("timeout_s = ", c.timeout_s, " must be in 0.001..86400 seconds"));
}

void mesh_rules(const DistributedConfig& c, std::vector<std::string>& out) {
  if (c.mesh_shape.empty()) {
    if (!c.mesh_axis_names.empty())
      out.push_back(str("mesh_axis_names = ", join(c.mesh_axis_names),
                        " needs a mesh_shape with one size per name"));
    return;
  }
  bool sizes_ok = true;
  for (int s : c.mesh_shape)
    if (s < 1) sizes_ok = false;
  if (!sizes_ok) out.push_back(str("mesh_shape = ", join(c.mesh_shape), " has a size below 1"));
  if (c.mesh_shape.size() > 4)
    out.push_back(str("mesh_shape = ", join(c.mesh_shape), " has ", c.mesh_shape.size(),
                      " dimensions; a mesh has at most 4"));
  if (sizes_ok && product(c.mesh_shape) == kTooManyDevices)
    out.push_back(str("mesh_shape = ", join(c.mesh_shape), " has more than ",
                      std::numeric_limits<int>::max(), " devices"));
  else if (sizes_ok && c.world_size >= 1 && product(c.mesh_shape) != c.world_size)
    out.push_back(str("mesh_shape = ", join(c.mesh_shape), " has ", product(c.mesh_shape),
                      " devices but world_size is ", c.world_size,
                      c.launcher_source.empty() ? "" : " (from " + c.launcher_source + ")"));
  if (c.mesh_axis_names.size() != c.mesh_shape.size())
    out.push_back(str("mesh_axis_names = ", join(c.mesh_axis_names), " has ",
                      c.mesh_axis_names.size(), " names for the ", c.mesh_shape.size(),
                      " dimensions of mesh_shape = ", join(c.mesh_shape)));
  std::set<std::string> seen, repeated;
  for (const std::string& n : c.mesh_axis_names) {
    if (n.empty())
      out.push_back(str("mesh_axis_names = ", join(c.mesh_axis_names), " has an empty name"));
    if (!seen.insert(n).second) repeated.insert(n);
  }
  for (const std::string& n : repeated)
    out.push_back(
        str("mesh_axis_names = ", join(c.mesh_axis_names), " names \"", n, "\" more than once"));
  // tp and pp must agree with the explicit mesh's "model" and "pipe" axes.
  if (c.mesh_axis_names.size() == c.mesh_shape.size()) {
    const std::pair<const char*, std::pair<const char*, int>> axes[] = {
        {"model", {"tensor_parallel_size", c.tensor_parallel_size}},
        {"pipe", {"pipeline_parallel_size", c.pipeline_parallel_size}},
        {"context", {"context_parallel_size", c.context_parallel_size}},
        {"expert", {"expert_parallel_size", c.expert_parallel_size}}};
    for (const auto& [axis, field] : axes) {
      const auto it = std::find(c.mesh_axis_names.begin(), c.mesh_axis_names.end(), axis);
      const int size = it == c.mesh_axis_names.end()
                           ? 1
                           : c.mesh_shape[static_cast<std::size_t>(it - c.mesh_axis_names.begin())];
      if (size != field.second)
        out.push_back(str(field.first, " = ", field.second, " but the mesh's \"", axis,
                          "\" axis has size ", size, " (mesh_shape = ", join(c.mesh_shape),
                          ", mesh_axis_names = ", join(c.mesh_axis_names), ")"));
    }
  }
}

}  // namespace

const char* backend_choice_name(BackendChoice b) {
  switch (b) {
    case BackendChoice::Threads:
      return "threads";
    case BackendChoice::Mpi:
      return "mpi";
    case BackendChoice::Nccl:
      return "nccl";
    case BackendChoice::Auto:
      break;
  }
  return "auto";
}

const char* mixed_precision_name(MixedPrecision m) {
  switch (m) {
    case MixedPrecision::Fp16:
      return "fp16";
    case MixedPrecision::Bf16:
      return "bf16";
    case MixedPrecision::No:
      break;
  }
  return "no";
}

int DistributedConfig::data_parallel_size() const {
  const int mp = tensor_parallel_size * pipeline_parallel_size * context_parallel_size;
  return mp > 0 ? world_size / mp : 0;
}

Device DistributedConfig::placement() const {
  // NCCL runs each process on the GPU its launch picks: cuda:(local rank % GPUs).
  const bool process_gpu =
      backend == BackendChoice::Nccl && (device == "auto" || device == "cuda");
  if (device == "auto" && !process_gpu) return default_device();
  Device d;
  try {
    d = process_gpu ? Device{DeviceKind::CUDA, 0} : parse_device(device);
  } catch (const InvalidArgument&) {
    DISTJAX_THROW(ConfigError, "[DistributedConfig] device = \"", device,
                  "\" names no device (auto, cpu, checked, cuda)");
  }
  if (process_gpu && tensor::cuda_device_count() > 0)
    d.index = local_rank % tensor::cuda_device_count();
  if (d.kind == DeviceKind::CUDA) {
    const int count = tensor::cuda_device_count();
    DISTJAX_CHECK(count > d.index, ConfigError, "[DistributedConfig] device = \"", device,
                  "\", but ", count == 0 ? tensor::cuda_unavailable_reason()
                                         : "this machine has " + std::to_string(count) + " GPUs");
  }
  return d;
}

std::chrono::milliseconds DistributedConfig::timeout() const {
  return std::chrono::milliseconds(std::max<std::int64_t>(1, std::llround(timeout_s * 1000.0)));
}

comm::Backend DistributedConfig::comm_backend() const {
  switch (backend) {
    case BackendChoice::Threads:
      return comm::Backend::Threads;
    case BackendChoice::Mpi:
      return comm::Backend::Mpi;
    case BackendChoice::Nccl:
      return comm::Backend::Nccl;
    case BackendChoice::Auto:
      break;
  }
  DISTJAX_THROW(ConfigError, "[DistributedConfig] backend \"", backend_choice_name(backend),
                "\" cannot launch (resolve() the config first)");
}

std::vector<std::string> DistributedConfig::problems() const {
  std::vector<std::string> out;
  size_rules(*this, out);
  // Each rule runs when the sizes it reads are valid (their own messages are above).
  const bool ws = world_size >= 1, nodes = num_nodes >= 1, per_node = num_processes_per_node >= 1;
  const bool mp_ok =
      tensor_parallel_size >= 1 && pipeline_parallel_size >= 1 && context_parallel_size >= 1;
  const int mp = tensor_parallel_size * pipeline_parallel_size * context_parallel_size;
  if (ws && nodes && per_node && world_size != num_nodes * num_processes_per_node)
    out.push_back(str("world_size = ", world_size,
                      " must equal num_nodes x num_processes_per_node = ", num_nodes, " x ",
                      num_processes_per_node, " = ", num_nodes * num_processes_per_node));
  if (ws && mp_ok && world_size % mp != 0)
    out.push_back(context_parallel_size == 1
                      ? str("tensor_parallel_size x pipeline_parallel_size = ",
                            tensor_parallel_size, " x ", pipeline_parallel_size, " = ", mp,
                            " must divide world_size = ", world_size)
                      : str("tensor_parallel_size x pipeline_parallel_size x "
                            "context_parallel_size = ",
                            tensor_parallel_size, " x ", pipeline_parallel_size, " x ",
                            context_parallel_size, " = ", mp, " must divide world_size = ",
                            world_size));
  if (expert_parallel_size < 1)
    out.push_back(str("expert_parallel_size = ", expert_parallel_size, " must be at least 1"));
  else if (ws && mp_ok && world_size % mp == 0 && data_parallel_size() % expert_parallel_size != 0)
    out.push_back(str("expert_parallel_size = ", expert_parallel_size,
                      " must divide the data-parallel size ", data_parallel_size(),
                      " (world_size / (tensor x pipeline x context)): the expert axis is carved "
                      "out of the devices that see different examples"));
  if (ws && rank >= world_size)
    out.push_back(str("rank = ", rank, " must be below world_size = ", world_size));
  if (per_node && local_rank >= num_processes_per_node)
    out.push_back(str("local_rank = ", local_rank,
                      " must be below num_processes_per_node = ", num_processes_per_node));
  mesh_rules(*this, out);
  if (!enabled && (world_size > 1 || tensor_parallel_size > 1 || pipeline_parallel_size > 1 ||
                   context_parallel_size > 1))
    out.push_back(str("enabled = false runs on one device, but world_size = ", world_size,
                      ", tensor_parallel_size = ", tensor_parallel_size,
                      ", pipeline_parallel_size = ", pipeline_parallel_size,
                      ", context_parallel_size = ", context_parallel_size));
  if (device != "auto") {
    try {
      // A CUDA device is checked where the run starts (the machine may differ from this one).
      (void)parse_device(device);
    } catch (const InvalidArgument&) {
      out.push_back(str("device = \"", device, "\" names no device (auto, cpu, checked, cuda)"));
    }
  }
  switch (backend) {
    case BackendChoice::Nccl:
      if (!comm::backend_available(comm::Backend::Nccl))
        out.push_back(
            "backend = \"nccl\" but this build has no NCCL (configure with CUDA and NCCL found)");
      if (device != "auto" && device != "cuda" && device.rfind("cuda:", 0) != 0)
        out.push_back(str("backend = \"nccl\" runs on GPUs, but device = \"", device, "\""));
      break;
    case BackendChoice::Mpi:
      if (!comm::backend_available(comm::Backend::Mpi))
        out.push_back("backend = \"mpi\" but this build has no MPI (configure with MPI found)");
      break;
    case BackendChoice::Threads:
      if (num_nodes > 1)
        out.push_back(str("backend = \"threads\" runs in one process on one node, but num_nodes = ",
                          num_nodes));
      if (launched_processes > 1)
        out.push_back(str("backend = \"threads\" runs in one process, but the launcher (",
                          launcher_source, ") started ", launched_processes,
                          " (use backend = \"mpi\" or \"auto\")"));
      break;
    case BackendChoice::Auto:
      break;
  }
  return out;
}

void DistributedConfig::validate(const std::string& context) const {
  const std::vector<std::string> p = problems();
  if (p.empty()) return;
  std::ostringstream os;
  os << "[DistributedConfig] " << (context.empty() ? "" : context + ": ") << p.size()
     << (p.size() == 1 ? " problem:" : " problems:");
  for (const std::string& m : p)
    os << "\n  - " << m;
  throw ConfigError(os.str());
}

DistributedConfig resolve(DistributedConfig c, const comm::LaunchEnvironment& env) {
  c.launcher = comm::launcher_name(env.launcher);
  c.launcher_source = env.source;
  c.launched_processes = env.launcher == comm::Launcher::None ? 1 : env.world_size;
  if (!c.enabled) {  // one device in this process, whoever launched it
    if (c.backend == BackendChoice::Auto) c.backend = BackendChoice::Threads;
    if (c.world_size == 0) c.world_size = 1;
    if (c.num_processes_per_node == 0) c.num_processes_per_node = c.world_size;
    c.launched_processes = 1;
    return c;
  }
  if (c.backend == BackendChoice::Auto)
    c.backend = comm::default_backend(env) == comm::Backend::Mpi ? BackendChoice::Mpi
                                                                 : BackendChoice::Threads;
  const bool multi_process = c.backend == BackendChoice::Mpi || c.backend == BackendChoice::Nccl;
  if (multi_process && env.launcher != comm::Launcher::None) {
    // The launcher describes the job that really runs; it wins over the file.
    c.rank = env.rank;
    c.world_size = env.world_size;
    c.local_rank = env.local_rank;
    if (env.num_nodes > 0) c.num_nodes = env.num_nodes;
    if (env.local_size > 0) c.num_processes_per_node = env.local_size;
  }
  if (env.master_addr) c.master_addr = *env.master_addr;
  if (env.master_port) c.master_port = *env.master_port;
  if (c.world_size == 0) {
    // A product out of an int's range leaves it 0, which validate() refuses.
    const std::int64_t n = !c.mesh_shape.empty()
                               ? product(c.mesh_shape)
                               : product({c.tensor_parallel_size, c.pipeline_parallel_size,
                                          c.context_parallel_size});
    if (std::abs(n) < kTooManyDevices) c.world_size = static_cast<int>(n);
  }
  if (c.num_processes_per_node == 0 && c.num_nodes > 0 && c.world_size % c.num_nodes == 0)
    c.num_processes_per_node = c.world_size / c.num_nodes;
  return c;
}

mesh::Mesh build_mesh(const DistributedConfig& c, const std::vector<std::string>& required_axes) {
  c.validate();
  const auto required = [&](const std::string& axis) {
    return std::find(required_axes.begin(), required_axes.end(), axis) != required_axes.end();
  };
  if (!c.mesh_shape.empty()) {
    for (const std::string& axis : required_axes)
      DISTJAX_CHECK(std::find(c.mesh_axis_names.begin(), c.mesh_axis_names.end(), axis) !=
                        c.mesh_axis_names.end(),
                    ConfigError, "[build_mesh] this program needs a mesh axis \"", axis,
                    "\" but mesh_axis_names = ", join(c.mesh_axis_names));
    return mesh::Mesh(c.mesh_shape, c.mesh_axis_names);
  }
  std::vector<int> shape;
  std::vector<std::string> names;
  const int ep = std::max(c.expert_parallel_size, 1);
  const std::pair<const char*, int> axes[] = {{"data", c.data_parallel_size() / ep},
                                              {"expert", ep},
                                              {"context", c.context_parallel_size},
                                              {"model", c.tensor_parallel_size},
                                              {"pipe", c.pipeline_parallel_size}};
  for (const auto& [name, size] : axes)
    if (size > 1 || required(name)) {
      shape.push_back(size);
      names.emplace_back(name);
    }
  if (shape.empty()) {  // one device, no axis asked for: a 1-device "data" line
    shape.push_back(1);
    names.emplace_back("data");
  }
  return mesh::Mesh(shape, names);
}

}  // namespace distjax::config
