// Communicator benchmarks. Plain run: threads backend on 2 devices, bus bandwidth of
// all_reduce, all_gather and reduce_scatter at 4 MiB and 64 MiB per device against a
// plain shared-memory reduce-scatter + all-gather (two threads, spin barrier) measured in
// the same run, and small-message latency. Under mpirun (DISTJAX_BENCH_MPI=1 or an MPI
// launcher's environment): the MPI backend against raw MPI_Allreduce; only rank 0 writes.
// With DISTJAX_BENCH_HOSTS=N (bench/hosts.sh: one rank on each of N hosts made of network
// namespaces, scripts/hosts.sh) the MPI lines are named hostsN_... : every byte over TCP.
//
// Sizes follow nccl-tests: S = the larger buffer of one device (all_reduce: the vector;
// all_gather: the output; reduce_scatter: the input); bus bandwidth = S / time x
// 2(p-1)/p for all_reduce and (p-1)/p for the other two.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "distjax/comm/launch.hpp"

#ifdef DISTJAX_HAVE_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace distjax::bench {
namespace {

using comm::Communicator;
using comm::ReduceOp;

constexpr std::int64_t kMiB = 1 << 20;

int iterations_for(std::int64_t bytes) { return bytes >= 64 * kMiB ? 6 : 30; }

std::string size_name(std::int64_t bytes) {
  return bytes >= kMiB ? std::to_string(bytes / kMiB) + "MiB" : std::to_string(bytes) + "B";
}

enum class Kind { AllReduce, AllGather, ReduceScatter };
const char* kind_name(Kind k) {
  return k == Kind::AllReduce ? "all_reduce" : k == Kind::AllGather ? "all_gather" : "reduce_scatter";
}
double bus_factor(Kind k, int p) {
  return k == Kind::AllReduce ? 2.0 * (p - 1) / p : static_cast<double>(p - 1) / p;
}

// ------------------------------------------------------------------ threads backend

// The reference's barrier: a sense-reversing spin barrier (pause, then yield), the
// fastest plain way for two threads on two cores to meet.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      gen_.store(gen + 1, std::memory_order_release);
      return;
    }
    for (int i = 0; gen_.load(std::memory_order_acquire) == gen; ++i) {
      if (i < 4000) {
        _mm_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<int> gen_{0};
};

// Median seconds per call of `kind` on the threads backend (p devices, S bytes).
double time_threads(Kind kind, int p, std::int64_t bytes) {
  const std::int64_t n = bytes / 4;
  const int iters = iterations_for(bytes);
  std::vector<double> times;
  comm::LaunchOptions o;
  o.num_devices = p;
  o.timeout = std::chrono::milliseconds(120000);
  comm::launch(o, [&](Communicator& c) {
    std::vector<float> in(n, 1.f + c.rank()), out(n, 0.f);
    auto once = [&] {
      switch (kind) {
        case Kind::AllReduce: c.all_reduce(in.data(), out.data(), n, DType::F32, ReduceOp::Sum); break;
        case Kind::AllGather: c.all_gather(in.data(), out.data(), n / p, DType::F32); break;
        case Kind::ReduceScatter:
          c.reduce_scatter(in.data(), out.data(), n / p, DType::F32, ReduceOp::Sum);
          break;
      }
    };
    for (int w = 0; w < 3; ++w) once();
    for (int i = 0; i < iters; ++i) {
      c.barrier();
      auto t0 = Clock::now();
      once();
      c.barrier();
      if (c.rank() == 0) times.push_back(seconds_since(t0));
    }
  });
  return median(times);
}

// The reference: the same algorithm written directly with plain threads and a spin barrier.
// Each thread reduces its half of both inputs in order 0..p-1, then copies the other
// halves from their owners.
double time_reference(Kind kind, int p, std::int64_t bytes) {
  const std::int64_t n = bytes / 4;
  const int iters = iterations_for(bytes);
  std::vector<std::vector<float>> in(p), out(p);
  SpinBarrier sync(p);
  std::vector<double> times;
  auto worker = [&](int r) {
    in[r].assign(n, 1.f + r);
    out[r].assign(n, 0.f);
    sync.arrive_and_wait();
    auto once = [&] {
      const std::int64_t block = n / p;
      if (kind == Kind::AllReduce) {
        const std::int64_t lo = block * r, hi = r == p - 1 ? n : lo + block;
        float* dst = out[r].data();
        std::memcpy(dst + lo, in[0].data() + lo, (hi - lo) * 4);
        for (int j = 1; j < p; ++j) {
          const float* s = in[j].data();
          for (std::int64_t i = lo; i < hi; ++i) dst[i] += s[i];
        }
        sync.arrive_and_wait();
        for (int j = 0; j < p; ++j) {
          if (j == r) continue;
          const std::int64_t l = block * j, h = j == p - 1 ? n : l + block;
          std::memcpy(dst + l, out[j].data() + l, (h - l) * 4);
        }
      } else if (kind == Kind::AllGather) {
        for (int j = 0; j < p; ++j) std::memcpy(out[r].data() + j * block, in[j].data(), block * 4);
      } else {
        float* dst = out[r].data();
        std::memcpy(dst, in[0].data() + r * block, block * 4);
        for (int j = 1; j < p; ++j) {
          const float* s = in[j].data() + r * block;
          for (std::int64_t i = 0; i < block; ++i) dst[i] += s[i];
        }
      }
      sync.arrive_and_wait();
    };
    for (int w = 0; w < 3; ++w) once();
    for (int i = 0; i < iters; ++i) {
      sync.arrive_and_wait();
      auto t0 = Clock::now();
      once();
      sync.arrive_and_wait();
      if (r == 0) times.push_back(seconds_since(t0));
    }
  };
  std::vector<std::thread> ts;
  for (int r = 0; r < p; ++r) ts.emplace_back(worker, r);
  for (auto& t : ts) t.join();
  return median(times);
}

// Median seconds of a 1-float all_reduce and of the reference's two-barrier equivalent.
std::pair<double, double> small_latency(int p) {
  const int iters = 2000;
  double ours = 0;
  comm::LaunchOptions o;
  o.num_devices = p;
  comm::launch(o, [&](Communicator& c) {
    float x = 1, y = 0;
    for (int w = 0; w < 100; ++w) c.all_reduce(&x, &y, 1, DType::F32, ReduceOp::Sum);
    c.barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) c.all_reduce(&x, &y, 1, DType::F32, ReduceOp::Sum);
    if (c.rank() == 0) ours = seconds_since(t0) / iters;
  });
  std::vector<float> vals(p, 1.f), res(p);
  SpinBarrier sync(p);
  double ref = 0;
  auto worker = [&](int r) {
    auto once = [&] {
      sync.arrive_and_wait();  // inputs published
      float acc = vals[0];
      for (int j = 1; j < p; ++j) acc += vals[j];
      res[r] = acc;
      sync.arrive_and_wait();  // inputs free again
    };
    for (int w = 0; w < 100; ++w) once();
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) once();
    if (r == 0) ref = seconds_since(t0) / iters;
  };
  std::vector<std::thread> ts;
  for (int r = 0; r < p; ++r) ts.emplace_back(worker, r);
  for (auto& t : ts) t.join();
  return {ours, ref};
}

void run_threads(Writer& out) {
  const int p = 2;
  for (std::int64_t bytes : {4 * kMiB, 64 * kMiB}) {
    for (Kind k : {Kind::AllReduce, Kind::AllGather, Kind::ReduceScatter}) {
      // Alternate ours and the reference so load from other processes hits both alike.
      std::vector<double> ours, ref;
      // Best of 5 alternating repetitions (each the median of its iterations): the
      // machine is shared, and the best case is what the code can do.
      for (int rep = 0; rep < 5; ++rep) {
        ours.push_back(time_threads(k, p, bytes));
        ref.push_back(time_reference(k, p, bytes));
      }
      const double f = bus_factor(k, p) * static_cast<double>(bytes) * 1e-9;
      json j = line(std::string("comm_threads_") + kind_name(k) + "_busbw_2dev_" + size_name(bytes),
                    f / minimum(ours), "GB/s");
      compare(j, "shared-memory reduce-scatter + all-gather (2 threads, spin barrier)",
              f / minimum(ref), true);
      out.write(j);
    }
  }
  auto [ours, ref] = small_latency(p);
  json j = line("comm_threads_all_reduce_latency_2dev_4B", ours * 1e6, "us");
  compare(j, "two spin-barrier phases (2 threads)", ref * 1e6, false);
  out.write(j);
}

// ------------------------------------------------------------------ MPI backend

#ifdef DISTJAX_HAVE_MPI
// Seconds per call of `fn`, a block of iters calls agreed as the slowest rank's.
template <class F>
double mpi_block(int iters, F&& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  double t = seconds_since(t0) / iters, tmax = 0;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return tmax;
}

// Best of alternating blocks of ours and raw MPI_Allreduce (same buffers, same run).
std::pair<double, double> mpi_all_reduce_vs_raw(Communicator& c, std::int64_t bytes, int iters,
                                                int reps) {
  const std::int64_t n = std::max<std::int64_t>(1, bytes / 4);
  std::vector<float> in(n, 1.f + c.rank()), res(n);
  auto ours = [&] { c.all_reduce(in.data(), res.data(), n, DType::F32, ReduceOp::Sum); };
  auto raw = [&] {
    MPI_Allreduce(in.data(), res.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  mpi_block(iters, ours);
  mpi_block(iters, raw);
  std::vector<double> to, tr;
  for (int rep = 0; rep < reps; ++rep) {
    to.push_back(mpi_block(iters, ours));
    tr.push_back(mpi_block(iters, raw));
  }
  return {minimum(to), minimum(tr)};
}

void run_mpi(Writer& out) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  // Lines of a run across hosts (bench/hosts.sh) are named by the hosts.
  const char* hosts = std::getenv("DISTJAX_BENCH_HOSTS");
  const std::string prefix =
      hosts && *hosts ? "hosts" + std::string(hosts) + "_" : "comm_mpi_";
  const std::string np = hosts && *hosts ? "" : std::to_string(p) + "proc_";
  // A 4-byte all-reduce takes ~0.25 us in shared memory, milliseconds over TCP between hosts.
  const int small_iters = hosts && *hosts ? 100 : 4000;
  // Small messages, with the per-call check (default) and without it (fast mode).
  for (bool check : {true, false}) {
    comm::LaunchOptions o;
    o.backend = comm::Backend::Mpi;
    o.timeout = std::chrono::milliseconds(120000);
    o.check_collectives = check;
    comm::launch(o, [&](Communicator& c) {
      auto [ours, raw] = mpi_all_reduce_vs_raw(c, 4, small_iters, 7);
      // For the record: raw MPI_Iallreduce polled with MPI_Test, what the library's
      // nonblocking path costs MPI alone.
      float x = 1, y = 0;
      auto inb = [&] {
        MPI_Request r;
        MPI_Iallreduce(&x, &y, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
        for (int f = 0; !f;) MPI_Test(&r, &f, MPI_STATUS_IGNORE);
      };
      std::vector<double> ti;
      for (int rep = 0; rep < 4; ++rep) ti.push_back(mpi_block(small_iters, inb));
      if (rank != 0) return;
      json j = line(prefix + "all_reduce_latency_" + np + "4B" + (check ? "" : "_fast"),
                    ours * 1e6, "us");
      compare(j, "raw MPI_Allreduce", raw * 1e6, false);
      j["check_collectives"] = check;
      j["raw_iallreduce_test_us"] = minimum(ti) * 1e6;
      out.write(j);
    });
  }
  comm::LaunchOptions o;
  o.backend = comm::Backend::Mpi;
  o.timeout = std::chrono::milliseconds(120000);
  comm::launch(o, [&](Communicator& c) {
    for (std::int64_t bytes : {4 * kMiB, 64 * kMiB}) {
      auto [ours, raw] = mpi_all_reduce_vs_raw(c, bytes, iterations_for(bytes), 3);
      if (rank != 0) continue;
      const double f = bus_factor(Kind::AllReduce, p) * static_cast<double>(bytes) * 1e-9;
      json j = line(prefix + "all_reduce_busbw_" + np + size_name(bytes), f / ours, "GB/s");
      compare(j, "raw MPI_Allreduce", f / raw, true);
      out.write(j);
    }
  });
  MPI_Finalize();
}
#endif

bool under_mpi() {
  for (const char* v : {"DISTJAX_BENCH_MPI", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

}  // namespace
}  // namespace distjax::bench

int main() {
  distjax::bench::Writer out;
  if (distjax::bench::under_mpi()) {
#ifdef DISTJAX_HAVE_MPI
    distjax::bench::run_mpi(out);
    return 0;
#else
    std::fprintf(stderr, "bench_comm: built without MPI; running the threads benchmarks\n");
#endif
  }
  distjax::bench::run_threads(out);
  return 0;
}
