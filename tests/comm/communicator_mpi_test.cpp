// MPI backend under `mpirun -np 4`: the same value checks as the threads backend (within
// tolerance: MPI may sum in another order), split sub-groups, asynchronous
// point-to-point, and the mismatch / timeout messages. Only rank 0 prints.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "comm/collective_checks.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/core/error.hpp"

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

TEST_F(MpiTest, SkippedCollectiveTimesOut) {
  std::string msg;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  try {
    launch(mpi_opts(500), [](Communicator& world) {
      std::vector<float> x(16, 1.f), y(16);
      if (world.rank() != 1) world.all_reduce(x.data(), y.data(), 16, DType::F32, ReduceOp::Sum);
    });
  } catch (const CommError& e) {
    msg = e.what();
  }
  if (r == 1) {
    EXPECT_EQ(msg, "");
  } else {
    EXPECT_TRUE(has(msg, "[all_reduce] timed out after 500 ms at call #0 of group (0,1,2,3)"))
        << msg;
    EXPECT_TRUE(has(msg, "device 1 did not arrive")) << msg;
  }
}

TEST_F(MpiTest, SeveralDevicesPerProcessIsNotImplemented) {
  LaunchOptions o = mpi_opts();
  o.devices_per_process = 2;
  EXPECT_THROW(launch(o, [](Communicator&) {}), NotImplemented);
}

// Prints failures of ranks other than 0 (whose full output is suppressed).
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace distjax::comm

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new distjax::comm::FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
