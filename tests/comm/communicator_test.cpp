// Threads backend: every collective's values against a host computation on 1, 2, 3, 4
// and 8 devices and on split sub-groups (2x4 rows and columns, 3x2), reproducibility,
// asynchronous point-to-point, stats and error propagation.
#include "distjax/comm/communicator.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "comm/collective_checks.hpp"
#include "comm/comm_test_util.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/comm/mpi/tsc_clock.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::comm {
namespace {

using testing::host_sum_f32;
using testing::input_f32;
using testing::input_i32;
using testing::inputs_f32;
using testing::inputs_i32;

LaunchOptions opts(int n) {
  LaunchOptions o;
  o.num_devices = n;
  o.timeout = std::chrono::milliseconds(20000);
  return o;
}

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, ValuesMatchHost) {
  const int n = GetParam();
  for (std::int64_t count : {1, 7, 1000, 20000}) {
    launch(opts(n), [&](Communicator& world) {
      EXPECT_EQ(world.size(), n);
      EXPECT_EQ(world.rank(), world.global_rank());
      testing::check_all_collectives(world, count);
    });
  }
}

TEST_P(Collectives, NonblockingValuesMatchHost) {
  const int n = GetParam();
  for (std::int64_t count : {1, 1000, 20000}) {
    launch(opts(n), [&](Communicator& c) { testing::check_nonblocking_collectives(c, count); });
  }
}

TEST_P(Collectives, NonblockingExchangesMatchHost) {
  const int n = GetParam();
  for (std::int64_t count : {1, 1000}) {
    launch(opts(n), [&](Communicator& c) { testing::check_nonblocking_exchanges(c, count); });
  }
}
TEST_P(Collectives, VariableSplitsMatchHost) {
  const int n = GetParam();
  for (std::int64_t scale : {1, 700}) {
    launch(opts(n), [&](Communicator& c) {
      testing::check_variable_exchanges(c, scale);
      if (c.size() >= 2) {
        Communicator pair = c.split(c.rank() / 2, c.rank());
        testing::check_variable_exchanges(pair, scale);
      }
    });
  }
}
INSTANTIATE_TEST_SUITE_P(Devices, Collectives, ::testing::Values(1, 2, 3, 4, 8));

TEST(NonBlocking, TheLinkTimeElapsesInTheBackground) {
  // A small all-reduce over a link of 100 ms per message step: the link time dwarfs the
  // work, so sanitizer builds and a loaded machine keep the bounds. Issued, then 1.5x the
  // blocking call's time of "compute", then waited on: the wait is (almost) free, where
  // the blocking form pays every step of the transfer.
  LaunchOptions o = opts(2);
  o.link = LinkModel{.latency_us = 100'000, .bandwidth_gbps = 0};
  launch(o, [](Communicator& world) {
    constexpr std::int64_t n = 1 << 12;
    std::vector<float> x(n, 1.f);
    using Clock = std::chrono::steady_clock;
    auto t0 = Clock::now();
    world.all_reduce(x.data(), x.data(), n, DType::F32, ReduceOp::Sum);
    const double blocking = std::chrono::duration<double>(Clock::now() - t0).count();
    t0 = Clock::now();
    Request r = world.iall_reduce(x.data(), x.data(), n, DType::F32, ReduceOp::Sum);
    const double issue = std::chrono::duration<double>(Clock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::duration<double>(1.5 * blocking));
    const auto t1 = Clock::now();
    r.wait();
    const double wait = std::chrono::duration<double>(Clock::now() - t1).count();
    EXPECT_GT(blocking, 0.09);
    EXPECT_LT(issue, 0.25 * blocking);
    EXPECT_LT(wait, 0.25 * blocking);
    EXPECT_EQ(x[0], 4.f);  // summed twice over 2 devices
  });
}

TEST(Split, RowsAndColumnsOf2x4) {
  launch(opts(8), [](Communicator& world) {
    const int r = world.rank();
    Communicator row = world.split(r / 4, r % 4);  // {0..3}, {4..7}
    Communicator col = world.split(r % 4, r / 4);  // {0,4}, {1,5}, ...
    ASSERT_EQ(row.size(), 4);
    ASSERT_EQ(col.size(), 2);
    EXPECT_EQ(row.rank(), r % 4);
    EXPECT_EQ(col.rank(), r / 4);
    std::vector<int> want_row{4 * (r / 4), 4 * (r / 4) + 1, 4 * (r / 4) + 2, 4 * (r / 4) + 3};
    EXPECT_EQ(row.group(), want_row);
    EXPECT_EQ(col.group(), (std::vector<int>{r % 4, r % 4 + 4}));
    testing::check_all_collectives(row, 1000);
    testing::check_all_collectives(col, 777);
    // Interleaved use of the parent and both children.
    testing::check_all_collectives(world, 10);
    testing::check_all_collectives(row, 20000);
  });
}

TEST(Split, ThreeByTwoAndKeyOrder) {
  launch(opts(6), [](Communicator& world) {
    const int r = world.rank();
    Communicator a = world.split(r / 2, r % 2);  // 3 groups of 2
    Communicator b = world.split(r % 2, r / 2);  // 2 groups of 3
    ASSERT_EQ(a.size(), 2);
    ASSERT_EQ(b.size(), 3);
    testing::check_all_collectives(a, 333);
    testing::check_all_collectives(b, 1001);
    // Key reverses the order: rank 0 of the new group is the old highest rank.
    Communicator rev = world.split(0, -r);
    EXPECT_EQ(rev.rank(), 5 - r);
    EXPECT_EQ(rev.group(), (std::vector<int>{5, 4, 3, 2, 1, 0}));
    testing::check_all_collectives(rev, 100);
    // A split of a split.
    Communicator bb = b.split(b.rank() == 0 ? 0 : 1, 0);
    EXPECT_EQ(bb.size(), b.rank() == 0 ? 1 : 2);
    testing::check_all_collectives(bb, 50);
  });
}

TEST(Reproducibility, SameBitsTwice) {
  const std::int64_t count = 300001;  // large: reduce-scatter + all-gather path
  std::vector<std::vector<float>> first(8), second(8);
  for (auto* out : {&first, &second}) {
    launch(opts(8), [&](Communicator& world) {
      auto x = inputs_f32(world.rank(), count);
      std::vector<float> y(count);
      world.all_reduce(x.data(), y.data(), count, DType::F32, ReduceOp::Sum);
      (*out)[world.rank()] = y;
    });
  }
  for (int d = 0; d < 8; ++d) {
    ASSERT_EQ(first[d].size(), static_cast<std::size_t>(count));
    EXPECT_EQ(std::memcmp(first[d].data(), second[d].data(), count * 4), 0) << "device " << d;
    EXPECT_EQ(std::memcmp(first[d].data(), first[0].data(), count * 4), 0) << "device " << d;
  }
}

TEST(Reductions, HalfTypesAndI64) {
  launch(opts(4), [](Communicator& world) {
    const int r = world.rank();
    std::vector<bf16> x(5, bf16(static_cast<float>(r + 1))), y(5);
    world.all_reduce(x.data(), y.data(), 5, DType::BF16, ReduceOp::Sum);
    for (auto v : y) EXPECT_EQ(static_cast<float>(v), 10.f);
    std::vector<f16> h(3, f16(static_cast<float>(r))), hy(3);
    world.all_reduce(h.data(), hy.data(), 3, DType::F16, ReduceOp::Max);
    for (auto v : hy) EXPECT_EQ(static_cast<float>(v), 3.f);
    std::vector<std::int64_t> l{std::int64_t(1) << 40, r}, ly(2);
    world.all_reduce(l.data(), ly.data(), 2, DType::I64, ReduceOp::Sum);
    EXPECT_EQ(ly[0], std::int64_t(4) << 40);
    EXPECT_EQ(ly[1], 6);
  });
}

TEST(PointToPoint, AsyncRingInOrderPerTag) {
  for (int n : {2, 3, 8}) {
    launch(opts(n), [n](Communicator& world) {
      const int r = world.rank();
      const int right = (r + 1) % n, left = (r + n - 1) % n;
      const std::int64_t count = 10000;
      auto x = inputs_f32(r, count);
      std::vector<float> y(count, -1.f);
      Request recv = world.irecv(y.data(), count, DType::F32, left, 7);
      Request send = world.isend(x.data(), count, DType::F32, right, 7);
      send.wait();
      recv.wait();
      EXPECT_TRUE(recv.test());
      for (std::int64_t i = 0; i < count; ++i) ASSERT_EQ(y[i], input_f32(left, i));
      // Several messages with the same tag arrive in order; different tags are separate.
      std::vector<Request> reqs;
      std::vector<std::int32_t> got(6, -1), sent(6);
      for (int k = 0; k < 3; ++k) {
        sent[k] = r * 100 + k;
        sent[3 + k] = -(r * 100 + k);
      }
      for (int k = 0; k < 3; ++k) reqs.push_back(world.irecv(&got[3 + k], 1, DType::I32, left, 2));
      for (int k = 0; k < 3; ++k) reqs.push_back(world.irecv(&got[k], 1, DType::I32, left, 1));
      for (int k = 0; k < 3; ++k) reqs.push_back(world.isend(&sent[k], 1, DType::I32, right, 1));
      for (int k = 0; k < 3; ++k)
        reqs.push_back(world.isend(&sent[3 + k], 1, DType::I32, right, 2));
      for (auto& q : reqs) q.wait();
      for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(got[k], left * 100 + k);
        EXPECT_EQ(got[3 + k], -(left * 100 + k));
      }
    });
  }
}

// Busy work (not a sleep) until `d` has passed on the wall clock, so a preempted thread
// still stops on time.
void compute_for(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  volatile double acc = 0;
  while (std::chrono::steady_clock::now() < until)
    for (int i = 0; i < 1000; ++i) acc = acc + i * 1e-9;
}

TEST(PointToPoint, AsyncRingOverlapsCompute) {
  // Under a link model of 80 ms per message a ring transfer takes about 80 ms. Posting it,
  // computing for 80 ms and then waiting takes about max(80, 80) ms when the transfer
  // progresses during the compute, and 80 + 80 ms when it only progresses in wait().
  // 80 ms dwarfs the scheduling noise of a busy 2-core machine.
  constexpr auto kLink = std::chrono::milliseconds(80);
  LaunchOptions o = opts(2);
  o.link.latency_us = std::chrono::duration<double, std::micro>(kLink).count();
  launch(o, [&](Communicator& world) {
    using Seconds = std::chrono::duration<double>;
    const int n = world.size(), r = world.rank();
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    const std::int64_t count = 10000;
    auto x = inputs_f32(r, count);
    std::vector<float> y(count);
    auto ring = [&](const std::function<void()>& between) {
      std::fill(y.begin(), y.end(), -1.f);
      world.barrier();  // start together: a late peer would delay the pairing
      const auto t0 = std::chrono::steady_clock::now();
      Request recv = world.irecv(y.data(), count, DType::F32, left, 7);
      Request send = world.isend(x.data(), count, DType::F32, right, 7);
      between();
      send.wait();
      recv.wait();
      const double s = Seconds(std::chrono::steady_clock::now() - t0).count();
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < count; ++i) wrong += y[i] != input_f32(left, i);
      EXPECT_EQ(wrong, 0);
      return s;
    };
    const double transfer = ring([] {});
    const auto t0 = std::chrono::steady_clock::now();
    compute_for(kLink);
    const double compute = Seconds(std::chrono::steady_clock::now() - t0).count();
    const double overlapped = ring([&] { compute_for(kLink); });
    EXPECT_GE(transfer, 0.9 * Seconds(kLink).count());  // the link model is in effect
    EXPECT_LT(overlapped, 0.8 * (transfer + compute))
        << "device " << r << ": transfer " << transfer << " s, compute " << compute
        << " s, both overlapped " << overlapped << " s";
  });
}

TEST(PointToPoint, SizeMismatchIsAnError) {
  EXPECT_THROW(launch(opts(2),
                      [](Communicator& world) {
                        std::vector<float> b(8);
                        if (world.rank() == 0) {
                          world.isend(b.data(), 8, DType::F32, 1, 0).wait();
                        } else {
                          world.irecv(b.data(), 4, DType::F32, 0, 0).wait();
                        }
                      }),
               CommError);
}

TEST(Stats, RingBytesAndCalls) {
  launch(opts(4), [](Communicator& world) {
    world.stats().reset();
    world.stats().record_spans = true;
    std::vector<float> x(1000), y(4000);
    world.all_reduce(x.data(), y.data(), 1000, DType::F32, ReduceOp::Sum);
    world.all_gather(x.data(), y.data(), 1000, DType::F32);
    world.all_gather(x.data(), y.data(), 1000, DType::F32);
    Communicator pair = world.split(world.rank() / 2, 0);
    pair.reduce_scatter(y.data(), x.data(), 1000, DType::F32, ReduceOp::Sum);
    const CommStats& s = world.stats();  // shared by the world and its sub-groups
    EXPECT_EQ(s[OpKind::AllReduce].calls, 1);
    EXPECT_EQ(s[OpKind::AllReduce].bytes_sent, 2 * 3 * 4000 / 4);
    EXPECT_EQ(s[OpKind::AllGather].calls, 2);
    EXPECT_EQ(s[OpKind::AllGather].bytes_received, 2 * 3 * 4000);
    EXPECT_EQ(s[OpKind::ReduceScatter].bytes_sent, 1 * 4000);
    EXPECT_EQ(s[OpKind::Split].calls, 1);
    EXPECT_EQ(s.spans.size(), 5u);
    EXPECT_GE(s.total_seconds(), s.total_wait_seconds());
  });
}

TEST(Stats, CountedPerGroupLabel) {
  for (int n : {2, 4, 8})
    launch(opts(n), [](Communicator& world) { testing::check_stats_per_label(world); });
}

TEST(Launch, DeviceExceptionWakesOthersAndIsRethrownWithIndex) {
  try {
    launch(opts(4), [](Communicator& world) {
      if (world.rank() == 2) DISTJAX_THROW(InvalidArgument, "[test] bad thing on purpose");
      world.barrier();  // the others must not hang here
    });
    FAIL() << "launch did not throw";
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("bad thing on purpose"), std::string::npos) << m;
    EXPECT_NE(m.find("device 2"), std::string::npos) << m;
  }
}

// A device failing elsewhere fails every group, but a device of a call that every rank
// has entered must not leave it while its peers still read its buffers (it used to: the
// first to finish its copies threw at the departure, and its buffers were reused or freed
// under the others; AddressSanitizer saw the reads after free). Devices 0-3 gather 16 MB
// each while device 4 fails in the middle; on an error a device overwrites its send
// buffer, as reusing or freeing it would. Every block received must be whole.
TEST(Launch, AFailureElsewhereLetsACallFinishReadingItsPeersBuffers) {
  constexpr std::int64_t kCount = 4 << 20;  // floats per device
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<float>> send(4), recv(4);
    for (int d = 0; d < 4; ++d) {
      send[d].assign(kCount, float(d + 1));
      recv[d].assign(4 * kCount, 0.f);
    }
    std::atomic<int> entering{0};
    EXPECT_THROW(launch(opts(5),
                        [&](Communicator& world) {
                          const int r = world.rank();
                          Communicator g = world.split(r < 4 ? 0 : 1, r);
                          if (r == 4) {
                            while (entering.load() < 4)
                              std::this_thread::yield();
                            std::this_thread::sleep_for(std::chrono::milliseconds(2));
                            DISTJAX_THROW(InvalidArgument, "[test] failing on purpose");
                          }
                          entering.fetch_add(1);
                          try {
                            g.all_gather(send[r].data(), recv[r].data(), kCount, DType::F32);
                          } catch (...) {
                            std::fill(send[r].begin(), send[r].end(), -1.f);
                            throw;
                          }
                          world.barrier();  // fails: device 4 is gone
                        }),
                 InvalidArgument);
    for (int d = 0; d < 4; ++d) {
      // A call that completed holds every block whole; one abandoned before its copies
      // holds zeros where it did not copy, never a peer's overwritten values.
      for (int j = 0; j < 4; ++j) {
        const float* b = recv[d].data() + j * kCount;
        const auto bad = std::find_if(b, b + kCount, [&](float v) { return v == -1.f; });
        EXPECT_EQ(bad, b + kCount) << "round " << round << ": device " << d << " read device " << j
                                   << "'s buffer after it left, at element " << (bad - b);
      }
    }
  }
}

TEST(Launch, LinkModelSlowsTransfers) {
  LaunchOptions o = opts(2);
  o.link.latency_us = 2000;  // 2 ms per step
  auto t0 = std::chrono::steady_clock::now();
  launch(o, [](Communicator& world) {
    float x = 1, y = 0;
    world.all_reduce(&x, &y, 1, DType::F32, ReduceOp::Sum);  // 2 steps on 2 devices
    EXPECT_EQ(y, 2.f);
  });
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(4));
}

TEST(Launch, SetLinkModelChangesTheLinkOfEveryDeviceBetweenCalls) {
  // 4 B all-reduces: free at launch, then 0.25 s of latency per step (2 steps on 2
  // devices), then free again. A sleep lasts at least its time, so the lower bound cannot
  // fail by load; the free calls would need 0.5 s of scheduling delay to fail.
  using Seconds = std::chrono::duration<double>;
  std::vector<double> t(3 * 2);
  launch(opts(2), [&](Communicator& world) {
    auto timed = [&] {
      float x = 1, y = 0;
      const auto t0 = std::chrono::steady_clock::now();
      world.all_reduce(&x, &y, 1, DType::F32, ReduceOp::Sum);
      EXPECT_EQ(y, 2.f);
      return Seconds(std::chrono::steady_clock::now() - t0).count();
    };
    t[0 + world.rank()] = timed();
    world.set_link_model({.latency_us = 250000});
    t[2 + world.rank()] = timed();
    world.set_link_model({});
    t[4 + world.rank()] = timed();
  });
  for (int d = 0; d < 2; ++d) {
    EXPECT_LT(t[0 + d], 0.5);
    EXPECT_GE(t[2 + d], 0.5);
    EXPECT_LT(t[4 + d], 0.5);
  }
}

TEST(Launch, SetLinkModelMustAgreeAndCoverTheWorld) {
  // Different models on different devices: a CommError naming the devices.
  try {
    launch(opts(2), [](Communicator& world) {
      world.set_link_model({.latency_us = world.rank() == 0 ? 1.0 : 2.0});
    });
    ADD_FAILURE() << "no exception";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
  }
  // A sub-group cannot change the world's link.
  try {
    launch(opts(4), [](Communicator& world) {
      Communicator half = world.split(world.rank() / 2, world.rank());
      half.set_link_model({.latency_us = 1.0});
    });
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("world communicator"), std::string::npos) << e.what();
  }
}

TEST(TscClock, FollowsSteadyClockBetweenAnchors) {
  // The MPI backend's small all-reduce reads its times from this clock (the counter where
  // the kernel's clocksource is the TSC, steady_clock elsewhere): over 50 ms from one
  // anchor every reading lies between the steady_clock readings around it (1 ms slack;
  // the rate is measured to about 1e-5) and never goes back.
  using Steady = std::chrono::steady_clock;
  mpi::TscClock clock;
  auto prev = clock.now();
  int outside = 0, backwards = 0, reads = 0;
  const auto until = Steady::now() + std::chrono::milliseconds(50);
  for (auto s0 = Steady::now(); s0 < until; s0 = Steady::now(), ++reads) {
    const auto t = clock.now();
    const auto s1 = Steady::now();
    if (t < s0 - std::chrono::milliseconds(1) || t > s1 + std::chrono::milliseconds(1)) ++outside;
    if (t < prev) ++backwards;
    prev = t;
  }
  EXPECT_GT(reads, 100);
  EXPECT_EQ(outside, 0);
  EXPECT_EQ(backwards, 0);
  const auto s = Steady::now();
  const auto a = clock.anchor();
  EXPECT_GE(a, s);
  EXPECT_LE(a, Steady::now());
}

TEST(Launch, ReductionOfAnUnknownDTypeOrReduceOpThrows) {
  // Every DType is reducible; a value outside the enums (a corrupted byte, a dtype added
  // without its reduction) must throw rather than reduce nothing or fall back to a sum.
  const auto bad_dtype = static_cast<DType>(200);
  const auto bad_op = static_cast<ReduceOp>(9);
  auto message_of = [](auto&& body) {
    try {
      launch(opts(2), [&](Communicator& world) {
        float x[4]{}, y[4]{};
        body(world, x, y);
      });
    } catch (const NotImplemented& e) {
      return std::string("NotImplemented: ") + e.what();
    } catch (const InvalidArgument& e) {
      return std::string("InvalidArgument: ") + e.what();
    } catch (const std::exception& e) {
      return std::string("other: ") + e.what();
    }
    return std::string("no exception");
  };
  std::string m = message_of([&](Communicator& c, float* x, float* y) {
    c.all_reduce(x, y, 2, bad_dtype, ReduceOp::Sum);
  });
  EXPECT_EQ(m.rfind("NotImplemented: [all_reduce] expected a reducible dtype (f32, bf16, f16, "
                    "i32, i64, f64), got dtype value 200",
                    0),
            0u)
      << m;
  m = message_of([&](Communicator& c, float* x, float* y) {
    c.reduce_scatter(x, y, 2, bad_dtype, ReduceOp::Max);
  });
  EXPECT_EQ(m.rfind("NotImplemented: [reduce_scatter] expected a reducible dtype", 0), 0u) << m;
  m = message_of([&](Communicator& c, float* x, float* y) {
    c.all_reduce(x, y, 2, DType::F32, bad_op);
  });
  EXPECT_EQ(m.rfind("InvalidArgument: [all_reduce] expected a reduce op (sum, mean, max), got "
                    "value 9",
                    0),
            0u)
      << m;
  m = message_of([&](Communicator& c, float* x, float* y) {
    c.reduce_scatter(x, y, 2, DType::I32, bad_op);
  });
  EXPECT_EQ(m.rfind("InvalidArgument: [reduce_scatter] expected a reduce op", 0), 0u) << m;
}

TEST(Launch, InvalidArguments) {
  EXPECT_THROW(launch(opts(0), [](Communicator&) {}), InvalidArgument);
  EXPECT_THROW(launch(opts(2),
                      [](Communicator& world) {
                        float x[2]{}, y[2]{};
                        world.permute(x, y, 1, DType::F32, {{0, 1}, {1, 1}});
                      }),
               InvalidArgument);
  // all_to_allv's counts: one per rank, none negative, adding up to each buffer.
  launch(opts(2), [](Communicator& world) {
    float x[4]{}, y[4]{};
    const Buffer four = Buffer::host(x, 4, DType::F32), out = Buffer::host(y, 4, DType::F32);
    auto refused = [&](const std::vector<std::int64_t>& send,
                       const std::vector<std::int64_t>& recv, const std::string& part) {
      try {
        world.all_to_allv(four, send, out, recv);
        ADD_FAILURE() << part << ": no error";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      }
    };
    refused({4}, {2, 2}, "[all_to_allv] send_counts has 1 entries for a group of 2");
    refused({5, -1}, {2, 2}, "[all_to_allv] send_counts[1] is -1, must be >= 0");
    refused({2, 2}, {2, 1}, "[all_to_allv] recv_counts add up to 3 elements but recv holds 4");
    world.barrier();  // nothing was issued: the group goes on
  });
  EXPECT_TRUE(backend_available(Backend::Threads));
#ifndef DISTJAX_HAVE_MPI
  EXPECT_FALSE(backend_available(Backend::Mpi));
  LaunchOptions o;
  o.backend = Backend::Mpi;
  try {
    launch(o, [](Communicator&) {});
    FAIL();
  } catch (const NotImplemented& e) {
    EXPECT_NE(std::string(e.what()).find("MPI backend is not compiled"), std::string::npos);
  }
#endif
}

// A buffer carries its real device (core/device.hpp, the type tensors use): the threads
// backend moves memory the host reaches and refuses a buffer on a GPU, naming the op and the
// device, before anything moves (instead of reading a device pointer as host memory).
TEST(Buffers, BuffersOnAGpuAndOnTheHostInOneCallAreRefusedNamingTheOpAndBothDevices) {
  // The threads backend moves CUDA buffers on their GPU and host buffers on the host; one
  // call whose buffers are on both is refused before anything moves or is issued.
  launch(opts(2), [](Communicator& world) {
    float x[4] = {1, 2, 3, 4}, y[4] = {9, 9, 9, 9};
    const Device gpu{DeviceKind::CUDA, 1};
    const Buffer on_gpu{x, 4, DType::F32, gpu}, recv_on_gpu{y, 4, DType::F32, gpu};
    const Buffer host_recv = Buffer::host(y, 4, DType::F32);
    const std::vector<std::pair<int, std::function<void()>>> calls = {
        {0, [&] { world.all_reduce(on_gpu, host_recv, ReduceOp::Sum); }},
        {1, [&] { world.iall_reduce(on_gpu, host_recv, ReduceOp::Sum).wait(); }},
        {2, [&] { world.all_gather(Buffer::host(x, 2, DType::F32), recv_on_gpu); }},
        {3, [&] { world.ireduce_scatter(on_gpu, Buffer::host(y, 2, DType::F32), ReduceOp::Sum); }},
        {4, [&] { world.all_to_all(on_gpu, host_recv); }},
        {5,
         [&] {
           world.permute(on_gpu, host_recv, {{0, 1}, {1, 0}});
         }},
    };
    const char* names[] = {"all_reduce",      "iall_reduce", "all_gather",
                           "ireduce_scatter", "all_to_all",  "permute"};
    for (const auto& [i, call] : calls) {
      try {
        call();
        ADD_FAILURE() << names[i] << ": no error";
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(std::string("[") + names[i] + "] expects its buffers on one device"),
                  std::string::npos)
            << what;
        EXPECT_NE(what.find("cuda:1"), std::string::npos) << what;
        EXPECT_NE(what.find("cpu"), std::string::npos) << what;
      }
    }
    // Nothing moved, and nothing was issued: the group still agrees on its next call.
    EXPECT_EQ(std::vector<float>(y, y + 4), std::vector<float>(4, 9.f));
    world.all_reduce(x, y, 4, DType::F32, ReduceOp::Sum);
    EXPECT_EQ(std::vector<float>(y, y + 4), (std::vector<float>{2, 4, 6, 8}));
  });
}

// The devices of a group must agree on where a call's buffers are: one device's on the
// checked device (as a GPU's would be) and the other's in host memory fail on both, naming
// the devices and what each called, before anything moves.
TEST(Buffers, DevicesWhoseBuffersAreOnDifferentDeviceKindsDisagree) {
  std::vector<std::string> errors(2);
  launch(opts(2), [&](Communicator& c) {
    using tensor::Tensor;
    std::vector<float> host(8, 1.f), out(8);
    const Tensor t = Tensor::ones({8}, DType::F32, Device{DeviceKind::Checked, 0});
    Tensor u = Tensor::empty({8}, DType::F32, Device{DeviceKind::Checked, 0});
    try {
      if (c.rank() == 0) {
        c.all_reduce(buffer_of(t), buffer_of(u), ReduceOp::Sum);
      } else {
        c.all_reduce(host.data(), out.data(), 8, DType::F32, ReduceOp::Sum);
      }
    } catch (const CommError& e) {
      errors[c.rank()] = e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("devices disagree"), std::string::npos) << e;
    EXPECT_NE(e.find("device 0 called all_reduce(count=8, f32, sum, on checked)"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("device 1 called all_reduce(count=8, f32, sum)"), std::string::npos) << e;
  }
}

// Tensors on the checked device (memory the host may touch only inside the kernel table)
// go through the threads backend by buffer_of: it moves every buffer, its own and its
// peers', only with the device-memory kernels (tensor/device_memory.hpp), the path a GPU's
// buffers take. A memcpy of a buffer outside them would fault and kill the test, naming
// the memory.
TEST(Buffers, CheckedDeviceTensorsGoThroughTheThreadsBackend) {
  LaunchOptions o = opts(4);
  o.device = Device{DeviceKind::Checked, 0};
  // 7 elements: one step; 20000: reduce-scatter + all-gather reading the peers' buffers.
  for (std::int64_t count : {7, 20000}) {
    launch(o, [&](Communicator& c) {
      using tensor::Tensor;
      const int n = c.size(), r = c.rank();
      std::vector<int> all(n);
      std::iota(all.begin(), all.end(), 0);
      const Tensor x = Tensor::from_vector(inputs_f32(r, count), {count});
      ASSERT_EQ(x.device(), (Device{DeviceKind::Checked, 0}));
      ASSERT_EQ(buffer_of(x).device, x.device());

      Tensor sum = Tensor::empty({count});
      c.all_reduce(buffer_of(x), buffer_of(sum), ReduceOp::Sum);
      EXPECT_EQ(sum.to_vector<float>(), host_sum_f32(all, count));
      Tensor in_place = x.clone();
      Request pending = c.iall_reduce(buffer_of(in_place), buffer_of(in_place), ReduceOp::Sum);
      pending.wait();
      EXPECT_EQ(in_place.to_vector<float>(), host_sum_f32(all, count));

      Tensor gathered = Tensor::empty({n, count});
      c.all_gather(buffer_of(x), buffer_of(gathered));
      EXPECT_EQ(gathered.view_rows(n - 1, n).to_vector<float>(), inputs_f32(n - 1, count));

      // A ring shift, as ppermute makes it: permute, and isend / irecv in flight.
      std::vector<std::pair<int, int>> ring;
      for (int i = 0; i < n; ++i)
        ring.emplace_back(i, (i + 1) % n);
      const int left = (r + n - 1) % n;
      Tensor from_left = Tensor::empty({count});
      c.permute(buffer_of(x), buffer_of(from_left), ring);
      EXPECT_EQ(from_left.to_vector<float>(), inputs_f32(left, count));
      Tensor received = Tensor::empty({count});
      Request recv = c.irecv(buffer_of(received), left, 3);
      Request send = c.isend(buffer_of(x), (r + 1) % n, 3);
      recv.wait();
      send.wait();
      EXPECT_EQ(received.to_vector<float>(), inputs_f32(left, count));
    });
  }
}

}  // namespace
}  // namespace distjax::comm
