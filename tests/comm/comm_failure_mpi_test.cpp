// MPI backend under `mpirun -np 4`: a device that leaves (its program finishes) while
// others wait on it is reported at once on both sides, long before the timeout; programs
// that end normally stay silent; and a device waiting for seconds backs off instead of
// holding a core. The threads backend's counterparts are in comm_failure_test.cpp. Only
// rank 0 prints.
#include "mpi_test_main.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "distjax/comm/launch.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Long enough that nothing in these tests may wait for it: a failure seen within
// kPrompt was reported, not timed out (bounds with ample slack for a loaded 2-core
// machine running 4 ranks).
constexpr int kTimeoutMs = 30000;
constexpr double kPrompt = 5.0;

LaunchOptions mpi_opts(int timeout_ms = kTimeoutMs, bool check = true) {
  LaunchOptions o;
  o.backend = Backend::Mpi;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  o.check_collectives = check;
  return o;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// What launch did on this process: the error it threw (empty: none) and how long it took.
struct Outcome {
  std::string msg;
  bool comm_error = false;
  double seconds = 0;
};

template <class F>
Outcome run(const LaunchOptions& o, F&& fn) {
  Outcome out;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  try {
    launch(o, fn);
  } catch (const CommError& e) {
    out.comm_error = true;
    out.msg = e.what();
  } catch (const Error& e) {
    out.msg = e.what();
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

// Lines every rank up between tests (a failed test may leave ranks at different places).
class MpiTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

// ---------------------------------------------------------------- a device leaves

struct SkipCase {
  const char* name;
  std::int64_t count;  // 16: the exchange's small all-reduce; 20000: MPI_Iallreduce
  bool check;
};

void PrintTo(const SkipCase& c, std::ostream* os) { *os << c.name; }

class SkippedCollectiveTest : public MpiTest, public ::testing::WithParamInterface<SkipCase> {};

// Device 1 skips the second all_reduce and finishes its program: the others fail at once
// naming the op, the call and device 1; device 1's launch fails too, naming the call it
// left the others in.
TEST_P(SkippedCollectiveTest, FailsEveryDevicePromptly) {
  const SkipCase c = GetParam();
  const int r = world_rank();
  Outcome out = run(mpi_opts(kTimeoutMs, c.check), [&](Communicator& world) {
    std::vector<float> x(c.count, 1.f), y(c.count);
    world.all_reduce(x.data(), y.data(), c.count, DType::F32, ReduceOp::Sum);
    if (world.rank() != 1) world.all_reduce(x.data(), y.data(), c.count, DType::F32, ReduceOp::Sum);
  });
  if (r == 0)
    std::printf("[ %s ] device 0 failed after %.3f s: %s\n", c.name, out.seconds, out.msg.c_str());
  EXPECT_TRUE(out.comm_error) << out.msg;
  EXPECT_TRUE(has(out.msg, "[all_reduce] cannot complete call #1 of group (0,1,2,3)")) << out.msg;
  EXPECT_LT(out.seconds, kPrompt) << out.msg;  // not at the 30 s timeout
  if (r == 1) {
    EXPECT_TRUE(has(out.msg, "[launch] device 1 finished its program while")) << out.msg;
    EXPECT_TRUE(has(out.msg, "(raised on device 1)")) << out.msg;
  } else {
    EXPECT_TRUE(has(out.msg, "device 1 did not arrive (device 1 finished its program")) << out.msg;
  }
}
INSTANTIATE_TEST_SUITE_P(Leave, SkippedCollectiveTest,
                         ::testing::Values(SkipCase{"small", 16, true},
                                           SkipCase{"large", 20000, true},
                                           SkipCase{"large_fast", 20000, false}),
                         [](const auto& info) { return std::string(info.param.name); });

// Device 3 skips a collective of its pair (2,3): device 2 fails naming it, device 3
// fails, and the pair (0,1), which finished everything, stays green.
TEST_F(MpiTest, SkippedSubGroupCollectiveFailsOnlyThatGroup) {
  const int r = world_rank();
  Outcome out = run(mpi_opts(), [](Communicator& world) {
    Communicator pair = world.split(world.rank() / 2, world.rank());  // (0,1), (2,3)
    std::vector<float> x(16, 1.f), y(16);
    if (world.rank() != 3) pair.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
  });
  EXPECT_LT(out.seconds, kPrompt) << out.msg;
  if (r < 2) {
    EXPECT_EQ(out.msg, "");
  } else if (r == 2) {
    EXPECT_TRUE(has(out.msg,
                    "[all_reduce] cannot complete call #0 of group (2,3): device 3 "
                    "did not arrive (device 3 finished its program"))
        << out.msg;
  } else {
    EXPECT_TRUE(has(out.msg, "[launch] device 3 finished its program while")) << out.msg;
    EXPECT_TRUE(has(out.msg, "[all_reduce] cannot complete call #0 of group (2,3)")) << out.msg;
  }
}

// Device 0 waits to receive from device 1, which finishes without sending.
TEST_F(MpiTest, ReceiveFromDeviceThatFinishedFailsPromptly) {
  const int r = world_rank();
  Outcome out = run(mpi_opts(), [](Communicator& world) {
    float v = 0;
    if (world.rank() == 0) world.irecv(&v, 1, DType::F32, 1, 5).wait();
  });
  EXPECT_LT(out.seconds, kPrompt) << out.msg;
  if (r == 0) {
    EXPECT_TRUE(has(out.msg,
                    "[irecv] device 0 receiving from device 1 with tag 5 in group "
                    "(0,1,2,3): device 1 finished its program without the matching isend"))
        << out.msg;
  } else if (r == 1) {
    EXPECT_TRUE(has(out.msg, "[launch] device 1 finished its program while")) << out.msg;
    EXPECT_TRUE(has(out.msg, "[irecv]")) << out.msg;
  } else {
    EXPECT_EQ(out.msg, "");
  }
}

// ---------------------------------------------------------------- normal ends stay green

// Devices that finish before the others have completed (or even waited on) calls they
// took part in: nobody fails, and nobody waits long at the end.
TEST_F(MpiTest, DevicesFinishingFirstDoNotFailTheOthers) {
  for (bool check : {true, false}) {
    Outcome out = run(mpi_opts(kTimeoutMs, check), [](Communicator& world) {
      const int r = world.rank();
      // Device 1 sends and finishes at once; device 0 receives after its notice came.
      float v = 0;
      if (r == 1) {
        v = 7;
        world.isend(&v, 1, DType::F32, 0, 5).wait();
        return;
      }
      if (r == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        world.irecv(&v, 1, DType::F32, 1, 5).wait();
        EXPECT_EQ(v, 7.f);
      }
    });
    EXPECT_EQ(out.msg, "");
    EXPECT_LT(out.seconds, kPrompt);
    out = run(mpi_opts(kTimeoutMs, check), [](Communicator& world) {
      // A small all-reduce (recursive doubling): device 0 completes it while device 3,
      // which posted only its first message, sleeps, and finishes; device 1 then waits
      // 600 ms more for device 3's second message, device 0's notice long there. The
      // notice says device 0 issued the call: device 1 must wait, not fail.
      std::vector<float> s(4, 1.f), t(4);
      Request small = world.iall_reduce(s.data(), t.data(), 4, DType::F32, ReduceOp::Sum);
      if (world.rank() == 3) std::this_thread::sleep_for(std::chrono::milliseconds(600));
      small.wait();
      EXPECT_EQ(t[3], 4.f);
    });
    EXPECT_EQ(out.msg, "");
    EXPECT_LT(out.seconds, kPrompt);
    out = run(mpi_opts(kTimeoutMs, check), [](Communicator& world) {
      // The same through MPI_Iallreduce: the others wait on it only 300 ms after issuing.
      constexpr int n = 20000;
      std::vector<float> x(n, 1.f), y(n);
      Request big = world.iall_reduce(x.data(), y.data(), n, DType::F32, ReduceOp::Sum);
      if (world.rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      big.wait();
      EXPECT_EQ(y[n - 1], 4.f);
    });
    EXPECT_EQ(out.msg, "");
    EXPECT_LT(out.seconds, kPrompt);
  }
}

// A device that computes past the timeout after the last collective: the others' launch
// stops waiting for it at the timeout and returns normally.
TEST_F(MpiTest, LateFinishPastTheTimeoutIsNoError) {
  const int r = world_rank();
  Outcome out = run(mpi_opts(300), [](Communicator& world) {
    float x = 1, y = 0;
    world.all_reduce(&x, &y, 1, DType::F32, ReduceOp::Sum);
    if (world.rank() == 3) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  });
  EXPECT_EQ(out.msg, "");
  if (r != 3) {
    EXPECT_LT(out.seconds, 1.2);  // stopped waiting at the 300 ms timeout
  }
}

// ---------------------------------------------------------------- waiting costs no core

double thread_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Devices 0, 2 and 3 wait 2 s for device 1 (in a small all-reduce, then in a receive):
// the CPU time of their thread stays a small fraction of the wall time.
TEST_F(MpiTest, WaitingDeviceBacksOff) {
  const int r = world_rank();
  double wall[2] = {}, cpu[2] = {};
  Outcome out = run(mpi_opts(), [&](Communicator& world) {
    float x = 1, y = 0;
    for (int phase = 0; phase < 2; ++phase) {
      world.barrier();
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_seconds();
      if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(2));
      if (phase == 0) {
        world.all_reduce(&x, &y, 1, DType::F32, ReduceOp::Sum);
      } else if (world.rank() == 1) {
        for (int d : {0, 2, 3})
          world.isend(&x, 1, DType::F32, d, 3).wait();
      } else {
        world.irecv(&y, 1, DType::F32, 1, 3).wait();
      }
      cpu[phase] = thread_cpu_seconds() - c0;
      wall[phase] = std::chrono::duration<double>(Clock::now() - t0).count();
    }
  });
  EXPECT_EQ(out.msg, "");
  double all[8];
  const double mine[2] = {cpu[0], cpu[1]};
  MPI_Gather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (r == 0)
    std::printf(
        "[ backoff ] CPU seconds while waiting ~%.2f s (all_reduce, irecv) on devices "
        "0,2,3: %.3f %.3f, %.3f %.3f, %.3f %.3f\n",
        wall[0], all[0], all[1], all[4], all[5], all[6], all[7]);
  if (r == 1) return;
  for (int phase = 0; phase < 2; ++phase) {
    EXPECT_GT(wall[phase], 1.5);
    EXPECT_LT(cpu[phase], 0.1 * wall[phase])
        << "phase " << phase << ": " << cpu[phase] << " s of CPU in " << wall[phase] << " s";
  }
}

}  // namespace
}  // namespace distjax::comm

int main(int argc, char** argv) {
  return distjax::testing::run_mpi_tests(argc, argv);
}
