// Communication of simulated devices on one GPU, and of MPI processes with GPU buffers,
// each against a plain reference measured in the same run:
//   threads (default): N simulated devices on the GPU all-reduce a `--mib` f32 buffer in
//     place (the threads backend, device to device on each device's stream). Line
//     gpu_threads_all_reduce_busbw_4dev_64MiB: bus bandwidth 2(N-1)/N x bytes / time,
//     against a plain device-to-device copy of the same bytes on the same card
//     (gpu_d2d_copy_gbps: bytes / time; `ratio`), and its memory traffic against the
//     copy's (`traffic_of_copy`; see run_threads): the devices share one GPU's memory, so
//     that, not a link, is what the reduction spends.
//   --mpi (under mpirun -np 2): the MPI backend's all-reduce of a device buffer, staged
//     through page-locked host memory, against the same staged by hand with a raw
//     MPI_Allreduce (copy to the host, MPI_Allreduce of the host buffer, copy back). Line
//     gpu_mpi_all_reduce_busbw_2proc_64MiB.
// The threads lines time `--iters` calls queued back to back (median of 5 such runs), the
// MPI line the median of `--iters` calls; DISTJAX_BENCH_OUT
// appends the lines to a file. `--device cpu` runs the same program on the CPU (a smoke
// test of the program where there is no GPU).
//   bench_gpu_comm [--devices 4] [--mib 64] [--iters 20] [--device cuda] [--mpi]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distjax/comm/launch.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/device_memory.hpp"
#include "distjax/tensor/tensor.hpp"

#ifdef DISTJAX_HAVE_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace {

using namespace distjax;
using tensor::Tensor;
using Clock = std::chrono::steady_clock;
namespace raw = tensor::raw;

struct Options {
  int devices = 4, iters = 20, warmup = 3;
  std::int64_t mib = 64;
  std::string device = "cuda";
  bool mpi = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--mpi") {
      o.mpi = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_gpu_comm: %s needs a value\n", k.c_str());
      std::exit(2);
    }
    const std::string v = argv[++i];
    if (k == "--devices") o.devices = std::stoi(v);
    else if (k == "--mib") o.mib = std::stoll(v);
    else if (k == "--iters") o.iters = std::stoi(v);
    else if (k == "--warmup") o.warmup = std::stoi(v);
    else if (k == "--device") o.device = v;
    else {
      std::fprintf(stderr, "bench_gpu_comm: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return o;
}

void emit(const nlohmann::json& j) {
  const std::string line = j.dump();
  std::printf("%s\n", line.c_str());
  if (const char* path = std::getenv("DISTJAX_BENCH_OUT")) std::ofstream(path, std::ios::app) << line << "\n";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of fn over iters calls after warm-up; fn returns once its work is done.
template <class F>
double time_median(const Options& o, F&& fn) {
  for (int i = 0; i < o.warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < o.iters; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

std::string size_tag(const Options& o, int ranks, const char* what) {
  return std::to_string(ranks) + what + "_" + std::to_string(o.mib) + "MiB";
}

// count normal values (not a constant: the data a collective really moves), on the
// current device.
Tensor random_tensor(std::int64_t count, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(count));
  random_normal(Key::from_seed(seed), v.data(), count);
  return Tensor::from_vector(v, {count});
}

// Median over 5 runs of the seconds per call of `calls` calls queued back to back and
// waited for once: a 64 MiB copy takes tens of microseconds, about what one host wait costs.
template <class F, class Wait>
double time_per_call(const Options& o, int calls, F&& fn, Wait&& wait) {
  for (int i = 0; i < o.warmup; ++i) fn();
  wait();
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) fn();
    wait();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / calls);
  }
  return median(t);
}

int run_threads(const Options& o, Device dev) {
  const std::int64_t count = o.mib * (1 << 20) / 4;
  const double bytes = static_cast<double>(count) * 4;
  const auto wait = [&] { raw::synchronize("bench", dev); };
  // The reference: one device-to-device copy of the same bytes on the same card.
  double copy_s = 0;
  {
    DeviceScope on(dev);
    const Tensor a = random_tensor(count, 1), b = Tensor::empty({count});
    copy_s = time_per_call(o, o.iters, [&] {
      raw::copy("bench", dev, b.raw_data(), a.raw_data(), static_cast<std::size_t>(bytes));
    }, wait);
  }
  const double copy_gbps = bytes / copy_s / 1e9;
  std::vector<double> per_device(o.devices);
  comm::LaunchOptions lo;
  lo.num_devices = o.devices;
  lo.device = dev;
  lo.timeout = std::chrono::milliseconds(120000);
  comm::launch(lo, [&](comm::Communicator& c) {
    Tensor x = random_tensor(count, 2 + static_cast<std::uint64_t>(c.rank()));
    per_device[c.rank()] = time_per_call(o, o.iters, [&] {
      c.all_reduce(comm::buffer_of(x), comm::buffer_of(x), comm::ReduceOp::Mean);
    }, wait);
  });
  const double t = *std::max_element(per_device.begin(), per_device.end());
  const int n = o.devices;
  const double busbw = 2.0 * (n - 1) / n * bytes / t / 1e9;
  // The devices share one GPU's memory: the reduction reads every rank's buffer and writes
  // every rank's result, 2n x bytes of memory traffic a call, where a copy moves 2 x bytes
  // (a read and a write). `traffic_of_copy` compares the two rates: 1.0 is a reduction that
  // moves its bytes as fast as cudaMemcpy moves a copy's. (A kernel can beat the copy
  // engine's rate a little, so this is a yardstick, not a bound.)
  const double traffic_gbps = 2.0 * n * bytes / t / 1e9;
  const double copy_traffic_gbps = 2.0 * copy_gbps;
  emit({{"name", "gpu_d2d_copy_gbps"}, {"value", copy_gbps}, {"unit", "GB/s"},
        {"device", dev.str()}, {"bytes", bytes}});
  emit({{"name", "gpu_threads_all_reduce_busbw_" + size_tag(o, n, "dev")},
        {"value", busbw},
        {"unit", "GB/s"},
        {"device", dev.str()},
        {"devices", n},
        {"bytes", bytes},
        {"ms_per_call", t * 1e3},
        {"baseline", "gpu_d2d_copy_gbps"},
        {"baseline_value", copy_gbps},
        {"ratio", busbw / copy_gbps},
        {"memory_traffic_gbps", traffic_gbps},
        {"copy_memory_traffic_gbps", copy_traffic_gbps},
        {"traffic_of_copy", traffic_gbps / copy_traffic_gbps}});
  return 0;
}

// The by-hand reference of the MPI line: MPI_Allreduce of a host f32 buffer in place (a
// sum), then the division by the process count that a mean needs.
void raw_allreduce_mean(void* host, std::int64_t count, int processes) {
#ifdef DISTJAX_HAVE_MPI
  auto* v = static_cast<float*>(host);
  MPI_Allreduce(MPI_IN_PLACE, v, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const float n = static_cast<float>(processes);
  for (std::int64_t i = 0; i < count; ++i) v[i] /= n;
#else
  (void)host;
  (void)count;
  (void)processes;
#endif
}

int run_mpi(const Options& o, Device dev) {
  if (!comm::backend_available(comm::Backend::Mpi)) {
    std::fprintf(stderr, "bench_gpu_comm: this build has no MPI\n");
    return 1;
  }
  const std::int64_t count = o.mib * (1 << 20) / 4;
  const std::size_t bytes = static_cast<std::size_t>(count) * 4;
  comm::LaunchOptions lo;
  lo.backend = comm::Backend::Mpi;
  lo.device = dev;
  lo.timeout = std::chrono::milliseconds(120000);
  comm::launch(lo, [&](comm::Communicator& c) {
    const int n = c.size();
    const Tensor x = random_tensor(count, 2 + static_cast<std::uint64_t>(c.rank()));
    // DistJax: the device buffer itself (staged by the backend).
    const double ours = time_median(o, [&] {
      c.all_reduce(comm::buffer_of(x), comm::buffer_of(x), comm::ReduceOp::Mean);
      raw::synchronize("bench", dev);
    });
    // By hand: to a page-locked host block, MPI_Allreduce of it in place, back (the
    // reference is MPI itself, not DistJax's communicator).
    raw::HostBlock host("bench", dev, bytes);
    const double hand = time_median(o, [&] {
      raw::to_host("bench", dev, x.raw_data(), host.data(), bytes);
      raw_allreduce_mean(host.data(), count, n);
      raw::from_host("bench", dev, host.data(), x.raw_data(), bytes);
      raw::synchronize("bench", dev);
    });
    // The slowest process sets the pace: the max over processes of each median.
    std::vector<double> t = {ours, hand}, tmax(2);
    c.all_reduce(comm::Buffer::host(t.data(), 2, DType::F64),
                 comm::Buffer::host(tmax.data(), 2, DType::F64), comm::ReduceOp::Max);
    if (c.rank() != 0) return;
    const double factor = 2.0 * (n - 1) / n * static_cast<double>(bytes) / 1e9;
    emit({{"name", "gpu_mpi_all_reduce_busbw_" + size_tag(o, n, "proc")},
          {"value", factor / tmax[0]},
          {"unit", "GB/s"},
          {"device", dev.str()},
          {"processes", n},
          {"bytes", bytes},
          {"ms_per_call", tmax[0] * 1e3},
          {"baseline", "staged_by_hand_raw_mpi_allreduce"},
          {"baseline_value", factor / tmax[1]},
          {"ratio", tmax[1] / tmax[0]}});
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const Device dev = parse_device(o.device);
  if (dev.kind == DeviceKind::CUDA && tensor::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_gpu_comm: no GPU: %s\n", tensor::cuda_unavailable_reason().c_str());
    return 1;
  }
  return o.mpi ? run_mpi(o, dev) : run_threads(o, dev);
}
