// collectives: prints a 2x4 mesh ("data" x "model") and runs every named-axis collective
// on it, printing each device's input and output. The same binary runs on simulated
// devices (threads, the default) and under MPI:
//
//   ./collectives                                   # 8 simulated devices in one process
//   mpirun -np 8 --oversubscribe ./collectives      # 8 processes (MPI is auto-detected)
//   ./collectives --backend threads|mpi
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/comm/launch_environment.hpp"
#include "distjax/mesh/mesh.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/ppermute.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/reduce.hpp"

using namespace distjax;
using namespace distjax::spmd;

namespace {

std::string fmt(const Tensor& t) {
  std::ostringstream os;
  os << "[";
  const std::vector<float> v = t.to_vector<float>();
  for (std::size_t i = 0; i < v.size(); ++i)
    os << (i ? ", " : "") << v[i];
  os << "]";
  if (t.rank() > 1) os << " shape " << to_string(t.shape());
  return os.str();
}

Tensor vec(std::vector<float> v) {
  const auto n = static_cast<std::int64_t>(v.size());
  return Tensor::from_vector(v, {n});
}

// Device 0 prints one line per device in device order: the lines are gathered over the
// world (fixed 192-byte slots), so the output is ordered under MPI too.
void print_ordered(DeviceContext& ctx, const std::string& line) {
  constexpr int kSlot = 192;
  std::vector<std::int32_t> mine(kSlot / 4, 0), all(kSlot / 4 * ctx.mesh().size());
  std::memcpy(mine.data(), line.data(), std::min<std::size_t>(line.size(), kSlot - 1));
  ctx.world().all_gather(mine.data(), all.data(), kSlot / 4, DType::I32);
  if (ctx.device() != 0) return;
  for (int d = 0; d < ctx.mesh().size(); ++d)
    std::cout << "  " << reinterpret_cast<const char*>(all.data() + d * (kSlot / 4)) << "\n";
  std::cout.flush();
}

void title(DeviceContext& ctx, const std::string& s) {
  ctx.world().barrier();
  if (ctx.device() == 0) std::cout << "\n" << s << "\n";
}

std::string who(DeviceContext& ctx) {
  return "device " + std::to_string(ctx.device()) + " (data=" + std::to_string(ctx.coord("data")) +
         ", model=" + std::to_string(ctx.coord("model")) + "): ";
}

void show(DeviceContext& ctx, const Tensor& in, const Tensor& out) {
  print_ordered(ctx, who(ctx) + fmt(in) + "  ->  " + fmt(out));
}

void run_all(DeviceContext& ctx) {
  const float d = static_cast<float>(ctx.device());

  title(ctx, "axis_index / axis_size");
  print_ordered(
      ctx, who(ctx) + "axis_index(data)=" + std::to_string(axis_index(ctx, "data")) +
               " axis_index(model)=" + std::to_string(axis_index(ctx, "model")) +
               " axis_index((data, model))=" + std::to_string(axis_index(ctx, {"data", "model"})) +
               " axis_size(model)=" + std::to_string(axis_size(ctx, "model")));

  Tensor x = vec({d});
  title(ctx, "psum(x, \"model\")  (all-reduce along each row)");
  show(ctx, x, psum(ctx, x, "model"));
  title(ctx, "psum(x, (\"data\", \"model\"))  (over the whole mesh)");
  show(ctx, x, psum(ctx, x, {"data", "model"}));
  title(ctx, "pmean(x, \"data\")  (mean along each column)");
  show(ctx, x, pmean(ctx, x, "data"));
  Tensor y = vec({static_cast<float>((ctx.device() * 5) % 8), 10 - d});
  title(ctx, "pmax(x, \"model\")");
  show(ctx, y, pmax(ctx, y, "model"));

  Tensor g = vec({10 * d, 10 * d + 1});
  title(ctx, "all_gather(x, \"model\", dim 0, tiled)");
  show(ctx, g, all_gather(ctx, g, "model", 0, true));
  title(ctx, "all_gather(x, \"data\", dim 0, stacked)");
  show(ctx, g, all_gather(ctx, g, "data", 0, false));

  Tensor s = vec({d, d, d, d});
  title(ctx, "psum_scatter(x, \"model\", dim 0, tiled)  (reduce-scatter: one element each)");
  show(ctx, s, psum_scatter(ctx, s, "model", 0, true));

  title(ctx, "ppermute(x, \"model\", ring +1)  (i sends to i+1 mod 4)");
  show(ctx, x, ppermute(ctx, x, "model", ring_permutation(4, 1)));

  Tensor a = vec({100 * d, 100 * d + 1, 100 * d + 2, 100 * d + 3});
  title(ctx, "all_to_all(x, \"model\", split 0, concat 0)  (element j goes to device j)");
  show(ctx, a, all_to_all(ctx, a, "model", 0, 0));

  title(ctx, "gradient of sum(all_gather(x, \"model\")) = psum_scatter(ones): 4 per element");
  tensor::TensorTree p;
  p.set("x", g);
  auto grads = autodiff::grad([&](const tensor::TensorTree& t) {
    return tensor::sum(all_gather(ctx, t.at("x"), "model", 0, true));
  })(p);
  show(ctx, g, grads.at("x"));

  title(ctx, "gradient of sum(pvary(x, \"data\") * axis_index(data)+1) = psum of cotangents: 1+2");
  auto grads2 = autodiff::grad([&](const tensor::TensorTree& t) {
    return tensor::sum(
        tensor::mul_scalar(pvary(ctx, t.at("x"), "data"), axis_index(ctx, "data") + 1));
  })(p);
  show(ctx, g, grads2.at("x"));

  title(ctx, "fold_rng_over_axis(key 0, \"data\"): equal along model, different along data");
  const Key k = fold_rng_over_axis(ctx, Key::from_seed(0), "data");
  print_ordered(
      ctx, who(ctx) + "key words " + std::to_string(k.words[0]) + " " + std::to_string(k.words[1]));

  title(ctx,
        "communication counters of each device (ring-algorithm bytes; include the gathers this "
        "example prints with)");
  const auto& st = ctx.comm_stats();
  print_ordered(
      ctx, who(ctx) + "all_reduce " + std::to_string(st[comm::OpKind::AllReduce].bytes_sent) +
               " B, all_gather " + std::to_string(st[comm::OpKind::AllGather].bytes_sent) +
               " B, permute " + std::to_string(st[comm::OpKind::Permute].bytes_sent) + " B sent");
}

}  // namespace

int main(int argc, char** argv) {
  ShardMapOptions opts;
  // mpirun / srun: MPI (comm/launch_environment.hpp reads Open MPI, PMI and Slurm variables).
  const comm::LaunchEnvironment env = comm::discover_launch_environment();
  opts.backend = comm::default_backend(env);
  std::string backend;
  CLI::App cli{"collectives: every collective on a 2x4 mesh of simulated devices"};
  cli.add_option("--backend", backend, "threads or mpi (default: mpi under a launcher)")
      ->check(CLI::IsMember({"threads", "mpi"}));
  CLI11_PARSE(cli, argc, argv);
  if (!backend.empty())
    opts.backend = backend == "mpi" ? comm::Backend::Mpi : comm::Backend::Threads;
  if (!comm::backend_available(opts.backend)) {
    std::cerr << "collectives: backend '" << comm::backend_name(opts.backend)
              << "' is not in this build (rebuild with MPI found by CMake)\n";
    return 1;
  }

  const Mesh mesh({2, 4}, {"data", "model"});
  try {
    auto f = shard_map(
        mesh,
        [](DeviceContext& ctx, const std::vector<Tensor>&) {
          run_all(ctx);
          return std::vector<Tensor>{};
        },
        {}, {}, opts);
    if (opts.backend == comm::Backend::Threads || env.rank == 0)
      std::cout << mesh << "backend: " << comm::backend_name(opts.backend) << "\n";
    f(std::vector<Tensor>{});
  } catch (const std::exception& e) {
    std::cerr << "collectives: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
