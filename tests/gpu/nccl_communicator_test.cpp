// The NCCL backend on a real GPU at world size 1 (label "gpu"): every collective and
// point-to-point form, blocking and non-blocking, f32 and bf16 with and without f32
// accumulation, split, permute with a self pair and with none (zeros), counters, the
// refusal of host buffers, and the abort path (a receive never matched, waited on with a
// short timeout, throws CommError naming the op, and the group stays failed). Skips with
// the reason where there is no GPU or the build has no NCCL. The multi-process path is
// not exercised here (docs/nccl.md says why and how it was reviewed).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "distjax/comm/communicator.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/core/dtype.hpp"
#include "distjax/core/error.hpp"
#include "gpu/gpu_test.hpp"
#ifdef DISTJAX_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using namespace distjax;
using namespace distjax::comm;

#define SKIP_WITHOUT_NCCL()                                                         \
  do {                                                                              \
    SKIP_WITHOUT_GPU();                                                             \
    if (!backend_available(Backend::Nccl)) GTEST_SKIP() << "no NCCL in this build"; \
  } while (0)

#ifdef DISTJAX_HAVE_CUDA
// count elements of T on cuda:0, freed at the end of the scope.
template <class T>
struct DeviceArray {
  explicit DeviceArray(const std::vector<T>& v) : n(static_cast<std::int64_t>(v.size())) {
    EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T) + 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  // What the device's compute stream sees once the calls before have completed.
  std::vector<T> read() const {
    EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    std::vector<T> v(static_cast<std::size_t>(n));
    EXPECT_EQ(cudaMemcpy(v.data(), p, v.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  Buffer buf(DType t) const { return {p, n, t, Device{DeviceKind::CUDA, 0}}; }
  void* p = nullptr;
  std::int64_t n = 0;
};

void run(const std::function<void(Communicator&)>& fn,
         std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
         bool half_in_f32 = true) {
  LaunchOptions o;
  o.backend = Backend::Nccl;
  o.timeout = timeout;
  o.half_reduce_in_f32 = half_in_f32;
  launch(o, fn);
}

std::vector<float> iota_f(int n, float base = 1.5f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = base + 0.25f * static_cast<float>(i);
  return v;
}
#endif

TEST(NcclCommunicator, WorldOfOneOnThisGpu) {
  SKIP_WITHOUT_NCCL();
#ifdef DISTJAX_HAVE_CUDA
  run([](Communicator& world) {
    EXPECT_EQ(world.size(), 1);
    EXPECT_EQ(world.rank(), 0);
    EXPECT_EQ(world.global_rank(), 0);
    EXPECT_EQ(world.group(), std::vector<int>{0});
  });
#endif
}

TEST(NcclCommunicator, AllReduceEveryOpBlockingAndNot) {
  SKIP_WITHOUT_NCCL();
#ifdef DISTJAX_HAVE_CUDA
  run([](Communicator& world) {
    const std::vector<float> x = iota_f(1000);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
      DeviceArray<float> in(x), out(std::vector<float>(x.size(), -7.f));
      world.all_reduce(in.buf(DType::F32), out.buf(DType::F32), op);
      EXPECT_EQ(out.read(), x) << reduce_op_name(op);
      DeviceArray<float> out2(std::vector<float>(x.size(), -7.f));
      Request r = world.iall_reduce(in.buf(DType::F32), out2.buf(DType::F32), op);
      r.wait();
      EXPECT_TRUE(r.test());
      EXPECT_EQ(out2.read(), x) << reduce_op_name(op);
    }
    // In place, and integers.
    DeviceArray<std::int32_t> ints(std::vector<std::int32_t>{3, -4, 5});
    world.all_reduce(ints.buf(DType::I32), ints.buf(DType::I32), ReduceOp::Sum);
    EXPECT_EQ(ints.read(), (std::vector<std::int32_t>{3, -4, 5}));
    EXPECT_EQ(world.stats()[OpKind::AllReduce].calls, 7);
  });
#endif
}

// The communication stream runs after the compute stream's work queued before the call,
// and the compute stream's work queued after wait() sees the result: a memset queued on
// the compute stream just before the calls, and a copy queued on it just after.
TEST(NcclCommunicator, OrderedAgainstTheComputeStream) {
  SKIP_WITHOUT_NCCL();
#ifdef DISTJAX_HAVE_CUDA
  run([](Communicator& world) {
    const std::size_t n = std::size_t{1} << 24;  // 64 MiB: the memset takes a while
    DeviceArray<float> in(std::vector<float>(n, 1.f)), out(std::vector<float>(n, 2.f)),
        copy(std::vector<float>(n, 3.f)), gathered(std::vector<float>(n, 4.f));
    ASSERT_EQ(cudaMemsetAsync(in.p, 0, n * sizeof(float), cudaStreamPerThread), cudaSuccess);
    Request a = world.iall_reduce(in.buf(DType::F32), out.buf(DType::F32), ReduceOp::Sum);
    Request b = world.iall_gather(in.buf(DType::F32), gathered.buf(DType::F32));
    b.wait();  // in any order
    a.wait();
    ASSERT_EQ(cudaMemcpyAsync(copy.p, out.p, n * sizeof(float), cudaMemcpyDeviceToDevice,
                              cudaStreamPerThread),
              cudaSuccess);
    EXPECT_EQ(copy.read(), std::vector<float>(n, 0.f));
    EXPECT_EQ(gathered.read(), std::vector<float>(n, 0.f));
  });
#endif
}

TEST(NcclCommunicator, Bf16ReductionsWithAndWithoutF32Accumulation) {
  SKIP_WITHOUT_NCCL();
#ifdef DISTJAX_HAVE_CUDA
  for (bool in_f32 : {true, false}) {
    run(
        [&](Communicator& world) {
          std::vector<bf16> x;
          for (float f : iota_f(300, -20.f))
            x.push_back(bf16(f));
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
            DeviceArray<bf16> in(x), out(std::vector<bf16>(x.size(), bf16(9.f)));
            world.all_reduce(in.buf(DType::BF16), out.buf(DType::BF16), op);
            const std::vector<bf16> got = out.read();
            for (std::size_t i = 0; i < x.size(); ++i)
              ASSERT_EQ(got[i].bits, x[i].bits)
                  << i << " " << reduce_op_name(op) << " f32=" << in_f32;
            DeviceArray<bf16> rs(std::vector<bf16>(x.size(), bf16(9.f)));
            world.ireduce_scatter(in.buf(DType::BF16), rs.buf(DType::BF16), op).wait();
            const std::vector<bf16> got_rs = rs.read();
            for (std::size_t i = 0; i < x.size(); ++i)
              ASSERT_EQ(got_rs[i].bits, x[i].bits) << i << " " << reduce_op_name(op);
          }
        },
        std::chrono::milliseconds(20000), in_f32);
  }
#endif
}

TEST(NcclCommunicator, GatherScatterAllToAllBroadcast) {
  SKIP_WITHOUT_NCCL();
#ifdef DISTJAX_HAVE_CUDA
  run([](Communicator& world) {
    const std::vector<float> x = iota_f(257);
    DeviceArray<float> in(x), a(std::vector<float>(x.size())), b(std::vector<float>(x.size())),
        c(std::vector<float>(x.size()));
    world.all_gather(in.buf(DType::F32), a.buf(DType::F32));
    EXPECT_EQ(a.read(), x);
    world.iall_gather(in.buf(DType::F32), b.buf(DType::F32)).wait();
    EXPECT_EQ(b.read(), x);
    world.reduce_scatter(in.buf(DType::F32), c.buf(DType::F32), ReduceOp::Sum);
    EXPECT_EQ(c.read(), x);
    DeviceArray<float> t(std::vector<float>(x.size()));
    world.all_to_all(in.buf(DType::F32), t.buf(DType::F32));
    EXPECT_EQ(t.read(), x);
    DeviceArray<double> d(std::vector<double>{1.0, 2.5});
    world.broadcast(d.buf(DType::F64), 0);
    EXPECT_EQ(d.read(), (std::vector<double>{1.0, 2.5}));
    world.barrier();
    EXPECT_EQ(world.stats()[OpKind::AllGather].calls, 2);
    EXPECT_EQ(world.stats()[OpKind::Barrier].calls, 1);
  });
#endif
}

TEST(NcclCommunicator, PermuteSelfPairCopiesNoPairZeros) {
  SKIP_WITHOUT_NCCL();
#ifdef DISTJAX_HAVE_CUDA
  run([](Communicator& world) {
    const std::vector<float> x = iota_f(100);
    DeviceArray<float> in(x), out(std::vector<float>(x.size(), 5.f));
    world.permute(in.buf(DType::F32), out.buf(DType::F32), {{0, 0}});
    EXPECT_EQ(out.read(), x);
    world.permute(in.buf(DType::F32), out.buf(DType::F32), {});
    EXPECT_EQ(out.read(), std::vector<float>(x.size(), 0.f));
  });
#endif
}

TEST(NcclCommunicator, SendAndReceiveToSelfGroupedInAnyWaitOrder) {
  SKIP_WITHOUT_NCCL();
#ifdef DISTJAX_HAVE_CUDA
  run([](Communicator& world) {
    const std::vector<float> x = iota_f(64);
    DeviceArray<float> in(x), out(std::vector<float>(x.size()));
    // The receive is posted first and waited on first: both are issued as one group.
    Request r = world.irecv(out.buf(DType::F32), 0, 3);
    Request s = world.isend(in.buf(DType::F32), 0, 3);
    r.wait();
    s.wait();
    EXPECT_EQ(out.read(), x);
    // test() issues and completes them too.
    DeviceArray<float> out2(std::vector<float>(x.size()));
    Request s2 = world.isend(in.buf(DType::F32), 0, 0);
    Request r2 = world.irecv(out2.buf(DType::F32), 0, 0);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!r2.test() && std::chrono::steady_clock::now() < give_up) {
    }
    r2.wait();  // complete already, or gives the timeout's error
    s2.wait();
    EXPECT_EQ(out2.read(), x);
    EXPECT_EQ(world.stats()[OpKind::Send].calls, 2);
    EXPECT_EQ(world.stats()[OpKind::Recv].calls, 2);
  });
#endif
}

TEST(NcclCommunicator, SplitMakesAWorkingSubgroup) {
  SKIP_WITHOUT_NCCL();
#ifdef DISTJAX_HAVE_CUDA
  run([](Communicator& world) {
    Communicator sub = world.split(0, 0);
    EXPECT_EQ(sub.size(), 1);
    EXPECT_EQ(sub.group(), std::vector<int>{0});
    const std::vector<float> x = iota_f(10);
    DeviceArray<float> in(x), out(std::vector<float>(x.size()));
    sub.all_reduce(in.buf(DType::F32), out.buf(DType::F32), ReduceOp::Sum);
    EXPECT_EQ(out.read(), x);
    // The parent still works after its split.
    world.barrier();
  });
#endif
}

TEST(NcclCommunicator, RefusesHostBuffersNamingOpAndDevice) {
  SKIP_WITHOUT_NCCL();
#ifdef DISTJAX_HAVE_CUDA
  run([](Communicator& world) {
    std::vector<float> x(4, 1.f), y(4);
    try {
      world.all_reduce(x.data(), y.data(), 4, DType::F32, ReduceOp::Sum);
      ADD_FAILURE() << "a host buffer was accepted";
    } catch (const NotImplemented& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("[all_reduce]"), std::string::npos) << what;
      EXPECT_NE(what.find("cpu"), std::string::npos) << what;
      EXPECT_NE(what.find("nccl"), std::string::npos) << what;
    }
  });
#endif
}

// A receive nobody sends: its wait must give up at the timeout, abort the NCCL
// communicator and say which transfer, and every later call of the group must fail too.
TEST(NcclCommunicator, UnmatchedReceiveTimesOutAndAbortsTheGroup) {
  SKIP_WITHOUT_NCCL();
#ifdef DISTJAX_HAVE_CUDA
  const auto t0 = std::chrono::steady_clock::now();
  run(
      [](Communicator& world) {
        DeviceArray<float> out(std::vector<float>(16));
        Request r = world.irecv(out.buf(DType::F32), 0, 7);
        try {
          r.wait();
          ADD_FAILURE() << "an unmatched receive completed";
        } catch (const CommError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("[recv]"), std::string::npos) << what;
          // NCCL may refuse a lone receive from itself when the group is issued; if it
          // accepts it, the wait times out and must say which transfer and that it aborted.
          if (what.find("timed out") != std::string::npos) {
            EXPECT_NE(what.find("tag 7"), std::string::npos) << what;
            EXPECT_NE(what.find("ncclCommAbort"), std::string::npos) << what;
          }
        }
        DeviceArray<float> a(std::vector<float>(4, 1.f));
        EXPECT_THROW(world.all_reduce(a.buf(DType::F32), a.buf(DType::F32), ReduceOp::Sum),
                     CommError);
      },
      std::chrono::milliseconds(500));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
#endif
}

}  // namespace
