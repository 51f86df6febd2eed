// No silent hangs (threads backend): mismatched collectives, a device that skips one, a
// device stuck elsewhere until the timeout, and point-to-point timeouts all fail on
// every device with one message naming the op(s) and the devices.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_test_util.hpp"
#include "distjax/comm/communicator.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm {
namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

LaunchOptions opts(int n, int timeout_ms) {
  LaunchOptions o;
  o.num_devices = n;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

using testing::run_failing;

TEST(Mismatch, AllGatherWhereOthersAllReduce) {
  auto out = run_failing(opts(4, 20000), [](Communicator& world) {
    std::vector<float> x(16, 1.f), y(64);
    world.barrier();
    world.barrier();
    world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);  // call #2
    if (world.rank() == 1) {
      world.all_gather(x.data(), y.data(), 16, DType::F32);  // call #3
    } else {
      world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
    }
    ADD_FAILURE() << "device " << world.rank() << " passed a mismatched collective";
  });
  const std::string& m = out.launch_msg;
  EXPECT_TRUE(has(m, "devices disagree at call #3 of group (0,1,2,3)")) << m;
  EXPECT_TRUE(has(m, "devices 0,2,3 called all_reduce(count=16, f32, sum)")) << m;
  EXPECT_TRUE(has(m, "device 1 called all_gather(count=16, f32)")) << m;
  EXPECT_TRUE(has(m, "raised on device")) << m;
  // Every device threw the same message.
  for (int d = 0; d < 4; ++d) {
    EXPECT_TRUE(has(out.device_msgs[d], "devices 0,2,3 called all_reduce")) << d;
    EXPECT_EQ(out.device_msgs[d], out.device_msgs[0]);
  }
  EXPECT_EQ(out.device_msgs[0].rfind("[all_reduce/all_gather]", 0), 0u) << out.device_msgs[0];
}

// The nonblocking forms are matched by issue order like the blocking ones: a device that
// issues iall_gather where the others issue iall_reduce fails them all at wait().
TEST(Mismatch, NonblockingFormsInFlight) {
  auto out = run_failing(opts(4, 20000), [](Communicator& world) {
    std::vector<float> x(16, 1.f), y(64), z(16);
    Request a = world.iall_reduce(x.data(), z.data(), 16, DType::F32, ReduceOp::Sum);  // #0
    Request b = world.rank() == 1 ? world.iall_gather(x.data(), y.data(), 16, DType::F32)
                                  : world.iall_reduce(x.data(), y.data(), 16, DType::F32,
                                                      ReduceOp::Sum);  // #1
    b.wait();
    a.wait();
    ADD_FAILURE() << "device " << world.rank() << " passed a mismatched collective";
  });
  const std::string& m = out.launch_msg;
  EXPECT_TRUE(has(m, "[all_reduce/all_gather] devices disagree at call #1 of group (0,1,2,3)"))
      << m;
  EXPECT_TRUE(has(m, "device 1 called all_gather(count=16, f32)")) << m;
  for (int d = 0; d < 4; ++d) EXPECT_TRUE(has(out.device_msgs[d], "devices disagree")) << d;
}

// A device that never issues the call: the others' requests fail at wait, naming it.
TEST(Timeout, NonblockingWithMissingDevice) {
  auto out = run_failing(opts(3, 300), [](Communicator& world) {
    std::vector<float> x(16, 1.f), y(16);
    if (world.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      return;
    }
    Request a = world.iall_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
    a.wait();
  });
  EXPECT_TRUE(has(out.device_msgs[0], "[all_reduce]")) << out.device_msgs[0];
  EXPECT_TRUE(has(out.device_msgs[0], "call #0 of group (0,1,2)")) << out.device_msgs[0];
  EXPECT_TRUE(has(out.device_msgs[0], "device 2 did not arrive")) << out.device_msgs[0];
}

TEST(Mismatch, CountDtypeRootAndPairsAreCompared) {
  auto out = run_failing(opts(2, 20000), [](Communicator& world) {
    std::vector<float> x(16), y(32);
    world.all_gather(x.data(), y.data(), world.rank() == 0 ? 16 : 8, DType::F32);
  });
  EXPECT_TRUE(has(out.launch_msg, "device 0 called all_gather(count=16, f32)")) << out.launch_msg;
  EXPECT_TRUE(has(out.launch_msg, "device 1 called all_gather(count=8, f32)")) << out.launch_msg;

  out = run_failing(opts(2, 20000), [](Communicator& world) {
    std::vector<float> x(16);
    world.broadcast(x.data(), 16, DType::F32, world.rank());
  });
  EXPECT_TRUE(has(out.launch_msg, "root=0")) << out.launch_msg;
  EXPECT_TRUE(has(out.launch_msg, "root=1")) << out.launch_msg;

  out = run_failing(opts(2, 20000), [](Communicator& world) {
    std::vector<std::int32_t> x(4), y(4);
    world.all_reduce(x.data(), y.data(), 4, world.rank() ? DType::I32 : DType::F32,
                     ReduceOp::Sum);
  });
  EXPECT_TRUE(has(out.launch_msg, "i32")) << out.launch_msg;

  out = run_failing(opts(2, 20000), [](Communicator& world) {
    float x = 0, y = 0;
    std::vector<std::pair<int, int>> p{{0, 1}};
    if (world.rank() == 1) p = {{1, 0}};
    world.permute(&x, &y, 1, DType::F32, p);
  });
  EXPECT_TRUE(has(out.launch_msg, "[permute] devices disagree")) << out.launch_msg;
}

// An all_to_allv whose counts do not pair up (device 2 expects 5 elements from device 1,
// which sends it 4) fails on every device naming the pair; one where a device calls the
// tiled all_to_all instead fails as a mismatch of ops.
TEST(Mismatch, VariableSplitsThatDoNotPairUp) {
  auto out = run_failing(opts(3, 20000), [](Communicator& world) {
    const int r = world.rank();
    std::vector<std::int64_t> send(3, 4), recv(3, 4);
    if (r == 2) recv[1] = 5;
    std::vector<float> x(12, float(r)), y(12 + (r == 2 ? 1 : 0));
    world.all_to_allv(Buffer::host(x.data(), 12, DType::F32), send,
                      Buffer::host(y.data(), std::int64_t(y.size()), DType::F32), recv);
    ADD_FAILURE() << "device " << r << " passed counts that do not pair up";
  });
  const std::string want =
      "[all_to_allv] devices disagree at call #0 of group (0,1,2): device 1 sends 4 elements "
      "to device 2, which expects 5";
  for (int d = 0; d < 3; ++d) EXPECT_EQ(out.device_msgs[d], want) << d;

  out = run_failing(opts(2, 20000), [](Communicator& world) {
    std::vector<float> x(4), y(4);
    if (world.rank() == 0)
      world.all_to_allv(Buffer::host(x.data(), 4, DType::F32), {2, 2},
                        Buffer::host(y.data(), 4, DType::F32), {2, 2});
    else
      world.all_to_all(x.data(), y.data(), 2, DType::F32);
  });
  EXPECT_TRUE(has(out.launch_msg, "device 0 called all_to_allv(f32)")) << out.launch_msg;
  EXPECT_TRUE(has(out.launch_msg, "device 1 called all_to_all(count=2, f32)")) << out.launch_msg;
}

TEST(Mismatch, SkippedCollectiveFailsFastNamingTheDevice) {
  // Device 1 skips the all_reduce and finishes; the others must not wait for the
  // 60 s timeout.
  auto t0 = std::chrono::steady_clock::now();
  auto out = run_failing(opts(4, 60000), [](Communicator& world) {
    std::vector<float> x(16, 1.f), y(16);
    if (world.rank() != 1) world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  const std::string& m = out.launch_msg;
  EXPECT_TRUE(has(m, "[all_reduce]")) << m;
  EXPECT_TRUE(has(m, "call #0 of group (0,1,2,3): device 1 did not arrive")) << m;
  EXPECT_TRUE(has(m, "device 1 finished its program")) << m;
  for (int d : {0, 2, 3}) EXPECT_TRUE(has(out.device_msgs[d], "device 1 did not arrive")) << d;
  EXPECT_EQ(out.device_msgs[1], "");
}

TEST(Timeout, DeviceStuckElsewhereTimesOut) {
  // Device 1 waits in a barrier of the sub-group (0,1) while 0, 2 and 3 wait in an
  // all_reduce of the world: a deadlock that only the timeout breaks.
  auto t0 = std::chrono::steady_clock::now();
  auto out = run_failing(opts(4, 300), [](Communicator& world) {
    Communicator pair = world.split(world.rank() / 2, 0);
    std::vector<float> x(16, 1.f), y(16);
    if (world.rank() == 1) {
      // Enter 150 ms late so the world group's deadline passes first.
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      pair.barrier();
    } else {
      world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  for (int d : {0, 2, 3}) {
    const std::string& m = out.device_msgs[d];
    EXPECT_TRUE(has(m, "[all_reduce] timed out after 300 ms at call #1 of group (0,1,2,3)"))
        << d << ": " << m;
    EXPECT_TRUE(has(m, "device 1 did not arrive (device 1 is in barrier call #0 of group (0,1))"))
        << m;
  }
  EXPECT_TRUE(has(out.device_msgs[1], "[barrier]") || has(out.device_msgs[1], "aborted"))
      << out.device_msgs[1];
}

TEST(Timeout, FailedGroupKeepsFailing) {
  LaunchOptions o = opts(2, 20000);
  launch(o, [](Communicator& world) {
    float x = 0, y[2];
    std::string first;
    try {
      if (world.rank() == 0) {
        world.all_gather(&x, y, 1, DType::F32);
      } else {
        world.barrier();
      }
    } catch (const CommError& e) {
      first = e.what();
    }
    ASSERT_TRUE(has(first, "devices disagree")) << first;
    try {
      world.barrier();
      ADD_FAILURE() << "a failed group accepted another call";
    } catch (const CommError& e) {
      EXPECT_EQ(std::string(e.what()), first);
    }
  });
}

TEST(Timeout, ReceiveWithoutSender) {
  auto out = run_failing(opts(2, 300), [](Communicator& world) {
    float x = 0;
    if (world.rank() == 0) {
      world.irecv(&x, 1, DType::F32, 1, 5).wait();
    } else {
      // Device 1 never sends: it computes past device 0's deadline, then finishes.
      std::this_thread::sleep_for(std::chrono::milliseconds(900));
    }
  });
  const std::string& m = out.device_msgs[0];
  EXPECT_TRUE(has(m, "[irecv] timed out after 300 ms")) << m;
  EXPECT_TRUE(has(m, "device 0 receiving 1 f32 from device 1 with tag 5")) << m;
  EXPECT_TRUE(has(m, "device 1 is not in a communicator call")) << m;
}

TEST(Timeout, ReceiveFromFinishedDeviceFailsFast) {
  auto t0 = std::chrono::steady_clock::now();
  auto out = run_failing(opts(2, 60000), [](Communicator& world) {
    float x = 0;
    if (world.rank() == 0) world.irecv(&x, 1, DType::F32, 1, 5).wait();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_TRUE(has(out.launch_msg, "device 1 finished its program without the matching isend"))
      << out.launch_msg;
}

// A device whose thread the system cannot start (no address space left for its stack, here
// under a lowered RLIMIT_AS) is an error naming the device, raised after the devices already
// started are stopped and joined: not std::terminate on a joinable thread, not a hang of the
// started ones waiting in a collective for the missing one. In a child process of its own.
void launch_without_room_for_threads() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long pages = 0;
  if (!f || std::fscanf(f, "%lu", &pages) != 1) std::_Exit(3);
  std::fclose(f);
  rlimit r{};
  getrlimit(RLIMIT_AS, &r);
  // Room for a thread or two (8 MiB stacks and their arenas), not for 16.
  r.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) +
               (rlim_t(24) << 20);
  if (setrlimit(RLIMIT_AS, &r) != 0) std::_Exit(4);
  try {
    launch(opts(16, 20000), [](Communicator& world) { world.barrier(); });
  } catch (const Error& e) {
    std::_Exit(has(e.what(), "could not start the thread of device") ? 0 : 5);
  }
  std::_Exit(6);  // every thread started: the limit did not bite
}

TEST(LaunchDeathTest, ADeviceThreadThatCannotStartIsAnErrorNotACrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(launch_without_room_for_threads(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace distjax::comm
