// MPI backend under `mpirun -np 4`: the same value checks as the threads backend (within
// tolerance: MPI may sum in another order), split sub-groups, asynchronous
// point-to-point, counters per group label, and the mismatch / timeout messages. Only
// rank 0 prints.
#include "mpi_test_main.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>

#include "comm/collective_checks.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::comm {
namespace {

using testing::input_f32;

LaunchOptions mpi_opts(int timeout_ms = 20000) {
  LaunchOptions o;
  o.backend = Backend::Mpi;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
int world_rank();
double seconds_since(std::chrono::steady_clock::time_point t0);

// Whether `msg` lists device d among those that did not arrive ("device 3 did not
// arrive", "devices 0,3 did not arrive"): on a loaded machine others may be late too.
bool names_missing(const std::string& msg, int d) {
  const std::regex re("devices? ([0-9]+,)*" + std::to_string(d) + "(,[0-9]+)* did not arrive");
  return std::regex_search(msg, re);
}

// Lines every rank up between tests (a failed test may leave ranks at different places).
class MpiTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

TEST_F(MpiTest, WorldIsFourDevices) {
  ASSERT_TRUE(backend_available(Backend::Mpi));
  launch(mpi_opts(), [](Communicator& world) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    EXPECT_EQ(world.size(), 4);
    EXPECT_EQ(world.rank(), r);
    EXPECT_EQ(world.global_rank(), r);
  });
}

TEST_F(MpiTest, CollectivesMatchHost) {
  for (bool check : {true, false}) {
    LaunchOptions o = mpi_opts();
    o.check_collectives = check;
    for (std::int64_t count : {1, 7, 1000, 20000}) {
      launch(o, [&](Communicator& world) { testing::check_all_collectives(world, count, false); });
    }
  }
}

TEST_F(MpiTest, NonblockingCollectivesMatchHost) {
  for (bool check : {true, false}) {
    LaunchOptions o = mpi_opts();
    o.check_collectives = check;
    for (std::int64_t count : {1, 1000, 40000}) {  // 40000 f32: larger than the staged size
      launch(o, [&](Communicator& world) {
        testing::check_nonblocking_collectives(world, count, false);
        Communicator pair = world.split(world.rank() / 2, world.rank());
        testing::check_nonblocking_collectives(pair, count, false);
      });
    }
  }
}

TEST_F(MpiTest, VariableSplitsMatchHost) {
  for (bool check : {true, false}) {
    LaunchOptions o = mpi_opts();
    o.check_collectives = check;
    for (std::int64_t scale : {1, 700}) {
      launch(o, [&](Communicator& world) {
        testing::check_variable_exchanges(world, scale);
        Communicator pair = world.split(world.rank() / 2, world.rank());
        testing::check_variable_exchanges(pair, scale);
      });
    }
  }
}

TEST_F(MpiTest, NonblockingExchangesMatchHost) {
  for (bool check : {true, false}) {
    LaunchOptions o = mpi_opts();
    o.check_collectives = check;
    for (std::int64_t count : {1, 1000}) {
      launch(o, [&](Communicator& world) {
        testing::check_nonblocking_exchanges(world, count);
        Communicator pair = world.split(world.rank() / 2, world.rank());
        testing::check_nonblocking_exchanges(pair, count);
      });
    }
  }
}

// Values of element i on global device d: small integers, so every sum is exact in every
// dtype and order.
double small_input(int d, std::int64_t i) { return (d + 1) * static_cast<double>(i % 7) - 3; }

template <class T>
void fill_small(std::vector<unsigned char>& bytes, int d, std::int64_t n) {
  bytes.resize(n * sizeof(T));
  T* p = reinterpret_cast<T*>(bytes.data());
  for (std::int64_t i = 0; i < n; ++i) p[i] = T(static_cast<float>(small_input(d, i)));
}
template <class T>
double element(const std::vector<unsigned char>& bytes, std::int64_t i) {
  return static_cast<double>(static_cast<float>(reinterpret_cast<const T*>(bytes.data())[i]));
}
template <>
double element<std::int64_t>(const std::vector<unsigned char>& bytes, std::int64_t i) {
  return static_cast<double>(reinterpret_cast<const std::int64_t*>(bytes.data())[i]);
}
template <>
double element<std::int32_t>(const std::vector<unsigned char>& bytes, std::int64_t i) {
  return reinterpret_cast<const std::int32_t*>(bytes.data())[i];
}

// One all-reduce of `count` elements of T on c, blocking on some devices and nonblocking
// on others (both forms of a call must meet), checked against the host and for the same
// bits on every device.
template <class T>
void check_small_all_reduce(Communicator& c, std::int64_t count, ReduceOp op) {
  const DType t = dtype_of<T>();
  const int me = c.global_rank();
  std::vector<unsigned char> x, y(count * sizeof(T));
  fill_small<T>(x, me, count);
  if ((me + count) % 2 == 0) {
    c.all_reduce(x.data(), y.data(), count, t, op);
  } else {
    c.iall_reduce(x.data(), y.data(), count, t, op).wait();
  }
  for (std::int64_t i = 0; i < count; ++i) {
    double want = op == ReduceOp::Max ? -1e30 : 0;
    for (int d : c.group())
      want = op == ReduceOp::Max ? std::max(want, small_input(d, i)) : want + small_input(d, i);
    if (op == ReduceOp::Mean) want /= c.size();
    const bool is_int = t == DType::I32 || t == DType::I64;
    if (is_int && op == ReduceOp::Mean) continue;  // integer division: the backend's own
    const double tol = t == DType::F32 || is_int ? 1e-6 : 1e-2;
    ASSERT_NEAR(element<T>(y, i), want, tol * (1 + std::abs(want)))
        << dtype_name(t) << " " << reduce_op_name(op) << " count " << count << " element " << i
        << " group " << c.size();
  }
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char b : y) h = (h ^ b) * 1099511628211ull;
  std::vector<std::int64_t> all(c.size());
  const auto mine = static_cast<std::int64_t>(h);
  c.all_gather(&mine, all.data(), 1, DType::I64);
  for (std::int64_t other : all) ASSERT_EQ(other, mine) << "devices got different bits";
}

// All-reduces small enough to travel inside the per-call exchange (up to 1 KiB, here 256
// f32) and just over it, every dtype and reduce op, in groups of 4, 3 (not a power of
// two: device 2 folds in through device 0), 2 and 1, with the check on and off.
TEST_F(MpiTest, SmallAllReduceEveryDtypeOpAndGroupSize) {
  for (bool check : {true, false}) {
    LaunchOptions o = mpi_opts();
    o.check_collectives = check;
    launch(o, [](Communicator& world) {
      Communicator three = world.split(world.rank() == 3 ? 1 : 0, world.rank());  // 3 and 1
      Communicator pair = world.split(world.rank() / 2, world.rank());
      for (Communicator* c : {&world, &three, &pair}) {
        for (std::int64_t count : {1, 5, 256, 257, 600}) {
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
            check_small_all_reduce<float>(*c, count, op);
            check_small_all_reduce<bf16>(*c, count, op);
            check_small_all_reduce<f16>(*c, count, op);
            check_small_all_reduce<std::int32_t>(*c, count, op);
            check_small_all_reduce<std::int64_t>(*c, count, op);
          }
        }
      }
    });
  }
}

// Requests in flight are waited on in different orders on different devices, across two
// groups too: each must progress while a device waits on another (MPI's nonblocking
// collectives do; so must the exchanges of small all-reduces and of the check).
TEST_F(MpiTest, NonblockingWaitedInOtherOrdersOnOtherDevices) {
  for (bool check : {true, false}) {
    LaunchOptions o = mpi_opts(5000);
    o.check_collectives = check;
    for (std::int64_t count : {1, 20000}) {
      launch(o, [&](Communicator& world) {
        Communicator pair = world.split(world.rank() / 2, world.rank());
        const int r = world.rank();
        std::vector<float> x = testing::inputs_f32(r, count), a(count), b(count), p(count);
        std::vector<float> g(4 * count);
        Request ra = world.iall_reduce(x.data(), a.data(), count, DType::F32, ReduceOp::Sum);
        Request rb = world.iall_reduce(x.data(), b.data(), count, DType::F32, ReduceOp::Max);
        Request rg = world.iall_gather(x.data(), g.data(), count, DType::F32);
        Request rp = pair.iall_reduce(x.data(), p.data(), count, DType::F32, ReduceOp::Sum);
        if (r % 2 == 0) {
          ra.wait();
          rb.wait();
          rg.wait();
          rp.wait();
        } else {
          rp.wait();
          rg.wait();
          rb.wait();
          ra.wait();
        }
        const auto want = testing::host_sum_f32(world.group(), count);
        const auto want_pair = testing::host_sum_f32(pair.group(), count);
        for (std::int64_t i = 0; i < count; ++i) {
          ASSERT_NEAR(a[i], want[i], 1e-3 + 1e-5 * std::abs(want[i])) << i;
          ASSERT_NEAR(p[i], want_pair[i], 1e-3 + 1e-5 * std::abs(want_pair[i])) << i;
          float m = testing::input_f32(0, i);
          for (int d = 1; d < 4; ++d) m = std::max(m, testing::input_f32(d, i));
          ASSERT_EQ(b[i], m) << i;
          for (int d = 0; d < 4; ++d) ASSERT_EQ(g[d * count + i], testing::input_f32(d, i));
        }
      });
    }
  }
}

TEST_F(MpiTest, SplitRowsAndColumns) {
  launch(mpi_opts(), [](Communicator& world) {
    const int r = world.rank();
    Communicator row = world.split(r / 2, r % 2);  // (0,1), (2,3)
    Communicator col = world.split(r % 2, r / 2);  // (0,2), (1,3)
    EXPECT_EQ(row.group(), (std::vector<int>{2 * (r / 2), 2 * (r / 2) + 1}));
    EXPECT_EQ(col.group(), (std::vector<int>{r % 2, r % 2 + 2}));
    testing::check_all_collectives(row, 999, false);
    testing::check_all_collectives(col, 1000, false);
    Communicator rev = world.split(0, -r);
    EXPECT_EQ(rev.rank(), 3 - r);
    testing::check_all_collectives(rev, 10, false);
  });
}

TEST_F(MpiTest, AsyncRing) {
  launch(mpi_opts(), [](Communicator& world) {
    const int n = world.size(), r = world.rank();
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    std::vector<float> x = testing::inputs_f32(r, 5000), y(5000);
    Request rr = world.irecv(y.data(), 5000, DType::F32, left, 3);
    Request sr = world.isend(x.data(), 5000, DType::F32, right, 3);
    sr.wait();
    rr.wait();
    for (int i = 0; i < 5000; ++i) ASSERT_EQ(y[i], input_f32(left, i));
    EXPECT_EQ(world.stats()[OpKind::Send].bytes_sent, 5000 * 4);
  });
}

// The MPI backend reaches the CPU and the checked device (under a tensor::HostAccess while
// MPI reads or writes a buffer) and refuses a GPU buffer naming the op and the device before
// the call is issued.
// Buffers on a device reach MPI through host staging (comm/detail/host_staging.hpp), the
// path a GPU's buffers take: on the checked device a host access outside the device-memory
// kernels faults, so this proves the staging copies are the only touches, for every form.
TEST_F(MpiTest, CheckedTensorsAreStagedThroughHostMemoryInEveryForm) {
  LaunchOptions o = mpi_opts();
  o.device = Device{DeviceKind::Checked, 0};
  launch(o, [](Communicator& world) {
    using tensor::Tensor;
    const int n = world.size(), r = world.rank();
    std::vector<int> all(n);
    for (int i = 0; i < n; ++i)
      all[i] = i;
    auto expect_near = [](const std::vector<float>& got, const std::vector<float>& want,
                          double rel) {
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], rel * (1 + std::abs(want[i]))) << "at " << i;
    };
    for (std::int64_t count : {7, 20000}) {  // inside the exchange, and an MPI collective
      const Tensor t = Tensor::from_vector(testing::inputs_f32(r, count), {count});
      ASSERT_EQ(t.device().kind, DeviceKind::Checked);
      const std::vector<float> want = testing::host_sum_f32(all, count);
      Tensor sum = Tensor::empty({count});
      world.all_reduce(buffer_of(t), buffer_of(sum), ReduceOp::Sum);
      expect_near(sum.to_vector<float>(), want, 1e-5);
      Tensor in_place = t.clone();  // send == recv stays in place on the host
      world.iall_reduce(buffer_of(in_place), buffer_of(in_place), ReduceOp::Sum).wait();
      expect_near(in_place.to_vector<float>(), want, 1e-5);
      // bf16: values whose sums bf16 holds exactly (the f32 inputs above cancel to small
      // remainders that bf16 cannot keep); the backend sums them in f32.
      std::vector<float> small(count), small_sum(count);
      for (std::int64_t i = 0; i < count; ++i) {
        small[i] = static_cast<float>((r + 1) * (i % 5));
        small_sum[i] = static_cast<float>(n * (n + 1) / 2 * (i % 5));
      }
      const Tensor half = tensor::astype(Tensor::from_vector(small, {count}), DType::BF16);
      Tensor half_sum = Tensor::empty({count}, DType::BF16);
      world.all_reduce(buffer_of(half), buffer_of(half_sum), ReduceOp::Sum);
      EXPECT_EQ(tensor::astype(half_sum, DType::F32).to_vector<float>(), small_sum);

      Tensor gathered = Tensor::empty({n, count});
      world.iall_gather(buffer_of(t), buffer_of(gathered)).wait();
      for (int j = 0; j < n; ++j)
        EXPECT_EQ(gathered.view_rows(j, j + 1).to_vector<float>(), testing::inputs_f32(j, count));
      Tensor scattered = Tensor::empty({count / n});
      const Tensor blocks = Tensor::from_vector(testing::inputs_f32(r, count / n * n),
                                                {count / n * n});
      world.reduce_scatter(buffer_of(blocks), buffer_of(scattered), ReduceOp::Sum);
      const std::vector<float> whole = testing::host_sum_f32(all, count / n * n);
      expect_near(scattered.to_vector<float>(),
                  std::vector<float>(whole.begin() + r * (count / n),
                                     whole.begin() + (r + 1) * (count / n)),
                  1e-5);
      Tensor b = r == 1 ? t.clone() : Tensor::zeros({count});
      world.broadcast(buffer_of(b), 1);
      EXPECT_EQ(b.to_vector<float>(), testing::inputs_f32(1, count));

      const int left = (r + n - 1) % n;
      Tensor received = Tensor::empty({count});
      Request rr = world.irecv(buffer_of(received), left, 4);
      Request sr = world.isend(buffer_of(t), (r + 1) % n, 4);
      sr.wait();
      while (!rr.test()) {
      }
      EXPECT_EQ(received.to_vector<float>(), testing::inputs_f32(left, count));
      std::vector<std::pair<int, int>> ring;
      for (int i = 0; i < n; ++i)
        ring.emplace_back(i, (i + 1) % n);
      Tensor from_left = Tensor::empty({count});
      world.permute(buffer_of(t), buffer_of(from_left), ring);
      EXPECT_EQ(from_left.to_vector<float>(), testing::inputs_f32(left, count));
    }
  });
}

// Non-blocking calls on device buffers start in issue order once their send copies are
// done. On odd ranks DISTJAX_STAGING_START=forced starts them only when they must, as on a
// GPU still copying, while even ranks start each at once: several calls in flight, a
// blocking call between them, completions in another order, a request dropped unwaited.
// Every rank's backend must still see one order, or the sums and maxima mix.
TEST_F(MpiTest, DeferredStagedCallsStartInIssueOrder) {
  LaunchOptions o = mpi_opts();
  o.device = Device{DeviceKind::Checked, 0};
  const char* rank_env = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank_env && std::atoi(rank_env) % 2 == 1) setenv("DISTJAX_STAGING_START", "forced", 1);
  launch(o, [](Communicator& world) {
    using tensor::Tensor;
    const int n = world.size(), r = world.rank();
    std::vector<int> all(n);
    for (int i = 0; i < n; ++i)
      all[i] = i;
    const std::int64_t count = 20000;
    auto near = [](const Tensor& got, const std::vector<float>& want) {
      const std::vector<float> g = got.to_vector<float>();
      ASSERT_EQ(g.size(), want.size());
      for (std::size_t i = 0; i < g.size(); ++i)
        ASSERT_NEAR(g[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << "at " << i;
    };
    const Tensor t = Tensor::from_vector(testing::inputs_f32(r, count), {count});
    const std::vector<float> want = testing::host_sum_f32(all, count);
    Tensor a = Tensor::empty({count}), c = Tensor::empty({count}), d = Tensor::empty({count});
    Tensor gathered = Tensor::empty({n, count}), received = Tensor::empty({count});
    const int left = (r + n - 1) % n;
    Request ra = world.iall_reduce(buffer_of(t), buffer_of(a), ReduceOp::Sum);
    Request rr = world.irecv(buffer_of(received), left, 9);
    Request sr = world.isend(buffer_of(t), (r + 1) % n, 9);
    Request rg = world.iall_gather(buffer_of(t), buffer_of(gathered));
    { Request dropped = world.iall_reduce(buffer_of(t), buffer_of(d), ReduceOp::Sum); }
    world.all_reduce(buffer_of(t), buffer_of(c), ReduceOp::Max);  // starts all before it
    Request rb = world.iall_reduce(buffer_of(t), buffer_of(d), ReduceOp::Max);
    rg.wait();
    for (int j = 0; j < n; ++j)
      EXPECT_EQ(gathered.view_rows(j, j + 1).to_vector<float>(), testing::inputs_f32(j, count));
    while (!rr.test()) {
    }
    EXPECT_EQ(received.to_vector<float>(), testing::inputs_f32(left, count));
    rb.wait();  // the last issued, waited before the first
    std::vector<float> most(count, -1e30f);
    for (int j = 0; j < n; ++j) {
      const std::vector<float> x = testing::inputs_f32(j, count);
      for (std::int64_t i = 0; i < count; ++i) most[i] = std::max(most[i], x[i]);
    }
    EXPECT_EQ(d.to_vector<float>(), most);
    EXPECT_EQ(c.to_vector<float>(), most);
    ra.wait();
    near(a, want);
    sr.wait();
  });
  unsetenv("DISTJAX_STAGING_START");
}

TEST_F(MpiTest, StatsCountedPerGroupLabel) {
  launch(mpi_opts(), [](Communicator& world) { testing::check_stats_per_label(world); });
}

TEST_F(MpiTest, MismatchNamesOpsAndDevices) {
  std::string msg;
  try {
    launch(mpi_opts(), [](Communicator& world) {
      std::vector<float> x(16, 1.f), y(64);
      world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
      if (world.rank() == 1) {
        world.all_gather(x.data(), y.data(), 16, DType::F32);
      } else {
        world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
      }
    });
  } catch (const CommError& e) {
    msg = e.what();
  }
  EXPECT_TRUE(has(msg, "[all_reduce/all_gather] devices disagree at call #1 of group (0,1,2,3)"))
      << msg;
  EXPECT_TRUE(has(msg, "devices 0,2,3 called all_reduce(count=16, f32, sum)")) << msg;
  EXPECT_TRUE(has(msg, "device 1 called all_gather(count=16, f32)")) << msg;
}

// In a group of 3 the extra device (2) folds in through device 0 and learns the verdict
// from it: it disagrees here, and all three name it.
TEST_F(MpiTest, MismatchInAGroupOfThree) {
  std::string msg;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    launch(mpi_opts(), [](Communicator& world) {
      Communicator three = world.split(world.rank() == 3 ? 1 : 0, world.rank());
      if (world.rank() == 3) return;
      std::vector<float> x(4, 1.f), y(12);
      if (three.rank() == 2) {
        three.all_gather(x.data(), y.data(), 4, DType::F32);
      } else {
        three.all_reduce(x.data(), y.data(), 4, DType::F32, ReduceOp::Sum);
      }
    });
  } catch (const CommError& e) {
    msg = e.what();
  }
  if (world_rank() != 3) {
    EXPECT_TRUE(has(msg, "[all_reduce/all_gather] devices disagree at call #0 of group (0,1,2)"))
        << msg;
    EXPECT_TRUE(has(msg, "device 2 called all_gather(count=4, f32)")) << msg;
    EXPECT_LT(seconds_since(t0), 10.0) << msg;  // seen by the check, not at the 20 s timeout
  }
}

// The same group of 3 with its extra device missing (busy past the timeout): device 0
// waits for it to fold in, device 1 for device 0; both time out naming device 2. (A device
// that finishes instead is named at once: comm_failure_mpi_test.cpp.)
TEST_F(MpiTest, MissingDeviceInAGroupOfThree) {
  std::string msg;
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    launch(mpi_opts(500), [](Communicator& world) {
      Communicator three = world.split(world.rank() == 3 ? 1 : 0, world.rank());
      if (world.rank() >= 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        return;
      }
      std::vector<float> x(4, 1.f), y(4);
      three.all_reduce(x.data(), y.data(), 4, DType::F32, ReduceOp::Sum);
    });
  } catch (const CommError& e) {
    msg = e.what();
  }
  if (world_rank() < 2) {
    EXPECT_TRUE(has(msg, "[all_reduce] timed out after 500 ms at call #0 of group (0,1,2)"))
        << msg;
    EXPECT_TRUE(names_missing(msg, 2)) << msg;
  }
}

// Fast mode: small all-reduces still carry their descriptor hash (it rides on their own
// messages), so two that differ only in their reduce op fail at once on every device.
TEST_F(MpiTest, FastModeSmallAllReduceMismatchFailsAtOnce) {
  std::string msg;
  LaunchOptions o = mpi_opts();
  o.check_collectives = false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    launch(o, [](Communicator& world) {
      std::vector<float> x(4, 1.f), y(4);
      world.all_reduce(x.data(), y.data(), 4, DType::F32,
                       world.rank() == 2 ? ReduceOp::Max : ReduceOp::Sum);
    });
  } catch (const CommError& e) {
    msg = e.what();
  }
  EXPECT_TRUE(has(msg, "devices disagree at call #0 of group (0,1,2,3)")) << msg;
  EXPECT_TRUE(has(msg, "device 2 called all_reduce(count=4, f32, max)")) << msg;
  EXPECT_LT(seconds_since(t0), 10.0) << msg;
}

int world_rank();

// The same mismatch through the nonblocking forms, two requests in flight.
TEST_F(MpiTest, NonblockingMismatchNamesOpsAndDevices) {
  std::string msg;
  try {
    launch(mpi_opts(), [](Communicator& world) {
      std::vector<float> x(16, 1.f), y(64), z(16);
      Request a = world.iall_reduce(x.data(), z.data(), 16, DType::F32, ReduceOp::Sum);
      Request b = world.rank() == 1 ? world.iall_gather(x.data(), y.data(), 16, DType::F32)
                                    : world.iall_reduce(x.data(), y.data(), 16, DType::F32,
                                                        ReduceOp::Sum);
      b.wait();
      a.wait();
    });
  } catch (const CommError& e) {
    msg = e.what();
  }
  EXPECT_TRUE(has(msg, "[all_reduce/all_gather] devices disagree at call #1 of group (0,1,2,3)"))
      << msg;
  EXPECT_TRUE(has(msg, "device 1 called all_gather(count=16, f32)")) << msg;
}

// Fast mode (no per-call check): a mismatch that hangs (or that MPI reports as an error)
// is diagnosed from the flight records, naming the ops and the devices.
TEST_F(MpiTest, FastModeMismatchDiagnosedFromFlightRecords) {
  std::string msg;
  LaunchOptions o = mpi_opts(1000);
  o.check_collectives = false;
  try {
    launch(o, [](Communicator& world) {
      std::vector<float> x(4000, 1.f), y(4000);
      world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
      // Device 1 reduces 4000 elements where the others reduce 16.
      world.all_reduce(x.data(), y.data(), world.rank() == 1 ? 4000 : 16, DType::F32,
                       ReduceOp::Sum);
    });
  } catch (const CommError& e) {
    msg = e.what();
  }
  EXPECT_TRUE(has(msg, "devices disagree at call #1 of group (0,1,2,3)")) << msg;
  EXPECT_TRUE(has(msg, "device 1 called all_reduce(count=4000, f32, sum)")) << msg;
}

// Fast mode: a device that never arrives is named, with where it is.
TEST_F(MpiTest, FastModeMissingDeviceDiagnosedFromFlightRecords) {
  const int r = world_rank();
  std::string msg;
  LaunchOptions o = mpi_opts(500);
  o.check_collectives = false;
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    launch(o, [](Communicator& world) {
      std::vector<float> x(16, 1.f), y(16);
      Communicator pair = world.split(world.rank() / 2, world.rank());  // (0,1), (2,3)
      if (world.rank() == 3) {
        pair.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);  // device 2 never
        return;
      }
      world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
    });
  } catch (const CommError& e) {
    msg = e.what();
  }
  if (r != 3) {
    // Every device waits at most the 500 ms timeout, device 3 (in its pair) included, so
    // which one times out first is a race of this test's timeouts. Each outcome is a
    // diagnosis of the hang from the flight records, naming the op and the devices:
    //  - the others time out first: "device 3 did not arrive", and where it is ("is in
    //    all_reduce call #0 of group (2,3)"), or "device 3 on <host> did not answer" if it already
    //    left;
    //  - device 3 times out first and its notice reaches them: "device 3 failed: ...
    //    device 2 did not arrive (... it is in all_reduce call #1 of group (0,1,2,3))".
    EXPECT_TRUE(has(msg, "[all_reduce]")) << msg;
    EXPECT_TRUE(names_missing(msg, 3) || has(msg, "device 3 failed")) << msg;
    EXPECT_TRUE(has(msg, "is in all_reduce call #") ||
                (has(msg, "device 3 on ") && has(msg, " did not answer")))
        << msg;
  }
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A device that never arrives: every device (the late one too, when it finally calls)
// gets a CommError naming the op and the missing device, none hangs.
TEST_F(MpiTest, AbsentDeviceFailsEveryDevice) {
  const int r = world_rank();
  std::string msg;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    launch(mpi_opts(500), [](Communicator& world) {
      std::vector<float> x(16, 1.f), y(16);
      if (world.rank() == 3) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
    });
  } catch (const CommError& e) {
    msg = e.what();
  }
  const double s = seconds_since(t0);
  EXPECT_TRUE(has(msg, "[all_reduce]")) << msg;
  EXPECT_TRUE(has(msg, "timed out after 500 ms at call #0 of group (0,1,2,3)")) << msg;
  EXPECT_TRUE(names_missing(msg, 3)) << msg;
  // No hang: the ranks that waited fail at the timeout, the late one as soon as it calls
  // (bounds with ample slack for a loaded machine).
  EXPECT_LT(s, r == 3 ? 1.5 + 5.0 : 0.5 + 5.0) << msg;
}

// A device whose program throws tells the others at once: their pending calls fail
// naming it and its error long before their (long) timeout. With and without the
// descriptor check (without it the waiting devices are inside the collective itself).
class ThrowingDeviceTest : public MpiTest, public ::testing::WithParamInterface<bool> {};

TEST_P(ThrowingDeviceTest, FailsTheOthersPromptly) {
  const int r = world_rank();
  std::string msg;
  bool comm_error = false;
  LaunchOptions o = mpi_opts(20000);
  o.check_collectives = GetParam();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    launch(o, [](Communicator& world) {
      std::vector<float> x(16, 1.f), y(16);
      world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
      if (world.rank() == 2) throw std::runtime_error("boom on purpose");
      world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
    });
  } catch (const CommError& e) {
    comm_error = true;
    msg = e.what();
  } catch (const Error& e) {
    msg = e.what();
  }
  if (r == 2) {
    EXPECT_FALSE(comm_error);
    EXPECT_EQ(msg, "[launch] device 2 raised: boom on purpose");
  } else {
    EXPECT_TRUE(comm_error) << msg;
    // Call #1 waits for device 2; call #0 may still be completing when the notice comes.
    EXPECT_TRUE(has(msg, "of group (0,1,2,3) abandoned: device 2 failed: boom on purpose"))
        << msg;
    EXPECT_TRUE(has(msg, "[all_reduce] call #")) << msg;
    EXPECT_LT(seconds_since(t0), 10.0) << msg;  // not at the 20 s timeout
  }
}
INSTANTIATE_TEST_SUITE_P(Check, ThrowingDeviceTest, ::testing::Bool());

// Same through a sub-group collective and point-to-point waits, all in groups device 1
// is not in but blocked until the notice (nobody sends what they wait for): every kind
// of wait hears of the failure.
TEST_F(MpiTest, ThrowingDeviceWakesPointToPointAndSubGroups) {
  const int r = world_rank();
  std::string msg;
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    launch(mpi_opts(20000), [](Communicator& world) {
      Communicator pair = world.split(world.rank() / 2, world.rank());  // (0,1), (2,3)
      std::vector<float> x(16, 1.f), y(16);
      // Device 1 throws only once the others are past the split (they tell it so).
      std::int32_t token = 0;
      if (world.rank() != 1) {
        world.isend(&token, 1, DType::I32, 1, 5).wait();
      } else {
        for (int src : {0, 2, 3}) world.irecv(&token, 1, DType::I32, src, 5).wait();
        throw InvalidArgument("[test] bad input on purpose");
      }
      if (world.rank() == 0) pair.irecv(y.data(), 16, DType::F32, 1, 7).wait();
      if (world.rank() == 2) pair.irecv(y.data(), 16, DType::F32, 1, 9).wait();  // from 3
      if (world.rank() == 3) pair.barrier();  // device 2 never comes
    });
  } catch (const Error& e) {
    msg = e.what();
  }
  if (r == 1) {
    EXPECT_EQ(msg, "[test] bad input on purpose (raised on device 1)");
  } else {
    const char* expected[] = {"[irecv] transfer with device 1 (tag 7) in group (0,1) abandoned",
                              "", "[irecv] transfer with device 3 (tag 9) in group (2,3) abandoned",
                              "[barrier] call #0 of group (2,3) abandoned"};
    EXPECT_TRUE(has(msg, expected[r])) << msg;
    EXPECT_TRUE(has(msg, "device 1 failed: [test] bad input on purpose")) << msg;
  }
}

// The race that used to hang: device 0 gives up on the descriptor check at its own short
// deadline but stays in its program (catching the error), while the others, arriving
// later, pass the check and enter the collective itself. They must fail at their timeout
// instead of blocking forever (at the latest 1.5 + 3 s; device 0 stays 6 s, so that its
// finished notice, which would fail them at once, comes after). 20000 elements (80 KB): a
// call that large starts its data operation only once the check passed. (A small
// all-reduce travels inside the check's own messages: there the others may complete it
// with device 0's data, sent before it left, which is no hang either.)
TEST_F(MpiTest, PeerThatLeftAfterTheCheckDoesNotHangTheOthers) {
  const int r = world_rank();
  std::string msg;
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    launch(mpi_opts(r == 0 ? 200 : 3000), [&](Communicator& world) {
      constexpr int n = 20000;
      std::vector<float> x(n, 1.f), y(n);
      // Device 3 comes 1.5 s late: long after device 0 gave up, even when a loaded machine
      // schedules device 0 a few hundred ms late.
      if (world.rank() == 3) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      try {
        world.all_reduce(x.data(), y.data(), n, DType::F32, ReduceOp::Sum);
      } catch (const CommError& e) {
        if (world.rank() != 0) throw;
        msg = e.what();  // device 0 carries on without the collective
        std::this_thread::sleep_for(std::chrono::milliseconds(6000));
      }
    });
  } catch (const CommError& e) {
    msg = e.what();
  }
  if (r == 0) {
    // Device 3 sleeps 1.5 s; on a loaded machine devices 1 and 2 may also come after
    // device 0's 200 ms ("devices 1,3 did not arrive"), device 3 is always named.
    EXPECT_TRUE(has(msg, "[all_reduce] timed out after 200 ms at call #0 of group (0,1,2,3): "))
        << msg;
    EXPECT_TRUE(names_missing(msg, 3)) << msg;
  } else {
    EXPECT_TRUE(has(msg, "[all_reduce] timed out after 3000 ms at call #0 of group (0,1,2,3)"))
        << msg;
    // Whether device 0's part of the check got out before it left is a race: either the
    // check completed and the transfer stalled, or device 0 never completed the check;
    // both name it, from the flight records, as not answering.
    EXPECT_TRUE(has(msg, "every device arrived and agreed, but the transfer did not complete") ||
                (has(msg, "device 0 on ") && has(msg, " did not answer")))
        << msg;
  }
}

TEST_F(MpiTest, SeveralDevicesPerProcessIsNotImplemented) {
  LaunchOptions o = mpi_opts();
  o.devices_per_process = 2;
  EXPECT_THROW(launch(o, [](Communicator&) {}), NotImplemented);
}

}  // namespace
}  // namespace distjax::comm

int main(int argc, char** argv) { return distjax::testing::run_mpi_tests(argc, argv); }
