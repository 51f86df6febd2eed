// The shared checks of every backend, used by the threads tests and the MPI tests: every
// collective's values against the host, and the counters per group label.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm_test_util.hpp"
#include "distjax/comm/communicator.hpp"

namespace distjax::comm::testing {

// f64 all_reduce (sum, in place, mean, max) and all_gather against the host, on the
// members `c.group()` of `c`. Exact: as in check_all_collectives.
inline void check_f64_collectives(Communicator& c, std::int64_t count, bool exact) {
  auto same = [exact](double got, double want) {
    // Another order of addition errs by ~1e-13 here; a pass through f32 by ~1e-5.
    return exact ? got == want : std::abs(got - want) <= 1e-10 + 1e-14 * std::abs(want);
  };
  const int n = c.size();
  const auto& g = c.group();
  auto x = inputs_f64(c.global_rank(), count);
  std::vector<double> y(count, -1.0);
  c.all_reduce(x.data(), y.data(), count, DType::F64, ReduceOp::Sum);
  const auto want = host_sum_f64(g, count);
  for (std::int64_t i = 0; i < count; ++i)
    ASSERT_TRUE(same(y[i], want[i])) << "f64 sum i=" << i << ": " << y[i] << " vs " << want[i];
  c.all_reduce(x.data(), x.data(), count, DType::F64, ReduceOp::Sum);  // in place
  for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(x[i], want[i])) << "f64 in place";
  x = inputs_f64(c.global_rank(), count);
  c.all_reduce(x.data(), y.data(), count, DType::F64, ReduceOp::Mean);
  for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(y[i], want[i] / n)) << "f64 mean";
  c.all_reduce(x.data(), y.data(), count, DType::F64, ReduceOp::Max);
  for (std::int64_t i = 0; i < count; ++i) {
    double m = input_f64(g[0], i);
    for (int j : g) m = std::max(m, input_f64(j, i));
    ASSERT_EQ(y[i], m) << "f64 max i=" << i;
  }
  std::vector<double> all(n * count);
  c.all_gather(x.data(), all.data(), count, DType::F64);
  for (int j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_EQ(all[j * count + i], input_f64(g[j], i)) << "f64 gather j=" << j << " i=" << i;
}

// Checks every collective on `c`, whose members are global device ids `c.group()`;
// inputs are keyed by global id so sub-groups can be checked against the host too.
inline void check_all_collectives(Communicator& c, std::int64_t count, bool exact = true) {
  // Exact: the threads backend sums in rank order; MPI may use another order.
  auto same = [exact](float got, float want) {
    // Inputs reach +-1e3 and cancel, so the absolute error of another order is ~1e-4.
    return exact ? got == want : std::abs(got - want) <= 1e-3f + 1e-5f * std::abs(want);
  };
  const int n = c.size(), r = c.rank();
  const auto& g = c.group();
  const int me = c.global_rank();
  ASSERT_EQ(g[r], me);
  // all_reduce: sum (bitwise equal to the host's rank-order sum), mean, max; in place too.
  {
    auto x = inputs_f32(me, count);
    std::vector<float> y(count, -1.f);
    c.all_reduce(x.data(), y.data(), count, DType::F32, ReduceOp::Sum);
    auto want = host_sum_f32(g, count);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(y[i], want[i])) << "sum i=" << i << ": " << y[i] << " vs " << want[i];
    c.all_reduce(x.data(), x.data(), count, DType::F32, ReduceOp::Sum);  // in place
    for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(x[i], want[i])) << "in-place i=" << i;
    x = inputs_f32(me, count);
    c.all_reduce(x.data(), y.data(), count, DType::F32, ReduceOp::Mean);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(y[i], want[i] / n)) << "mean i=" << i;
    c.all_reduce(x.data(), y.data(), count, DType::F32, ReduceOp::Max);
    for (std::int64_t i = 0; i < count; ++i) {
      float m = input_f32(g[0], i);
      for (int j : g) m = std::max(m, input_f32(j, i));
      ASSERT_EQ(y[i], m) << "max i=" << i;
    }
    auto xi = inputs_i32(me, count);
    std::vector<std::int32_t> yi(count);
    c.all_reduce(xi.data(), yi.data(), count, DType::I32, ReduceOp::Sum);
    for (std::int64_t i = 0; i < count; ++i) {
      std::int32_t s = 0;
      for (int j : g) s += input_i32(j, i);
      ASSERT_EQ(yi[i], s);
    }
  }
  check_f64_collectives(c, count, exact);
  // all_gather, f32 and i32: rank-major blocks.
  {
    auto x = inputs_f32(me, count);
    std::vector<float> y(n * count);
    c.all_gather(x.data(), y.data(), count, DType::F32);
    for (int j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < count; ++i) ASSERT_EQ(y[j * count + i], input_f32(g[j], i));
    auto xi = inputs_i32(me, count);
    std::vector<std::int32_t> yi(n * count);
    c.all_gather(xi.data(), yi.data(), count, DType::I32);
    for (int j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < count; ++i) ASSERT_EQ(yi[j * count + i], input_i32(g[j], i));
  }
  // reduce_scatter: block r of the rank-order sum of everyone's (n*count) input.
  {
    auto x = inputs_f32(me, n * count);
    std::vector<float> y(count);
    c.reduce_scatter(x.data(), y.data(), count, DType::F32, ReduceOp::Sum);
    auto want = host_sum_f32(g, count, r * count);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(y[i], want[i])) << "rs i=" << i;
    c.reduce_scatter(x.data(), y.data(), count, DType::F32, ReduceOp::Mean);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_TRUE(same(y[i], want[i] / n));
  }
  // all_to_all, f32 and i32: block j of my recv is block r of rank j's send.
  {
    auto x = inputs_f32(me, n * count);
    std::vector<float> y(n * count);
    c.all_to_all(x.data(), y.data(), count, DType::F32);
    for (int j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < count; ++i)
        ASSERT_EQ(y[j * count + i], input_f32(g[j], r * count + i));
    auto xi = inputs_i32(me, n * count);
    std::vector<std::int32_t> yi(n * count);
    c.all_to_all(xi.data(), yi.data(), count, DType::I32);
    for (int j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < count; ++i)
        ASSERT_EQ(yi[j * count + i], input_i32(g[j], r * count + i));
  }
  // broadcast from every root.
  for (int root = 0; root < n; ++root) {
    auto x = inputs_f32(me, count);
    c.broadcast(x.data(), count, DType::F32, root);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_EQ(x[i], input_f32(g[root], i));
  }
  // permute: a shift-by-one ring, and a partial permutation (receivers of nothing get 0).
  {
    std::vector<std::pair<int, int>> ring, partial;
    for (int j = 0; j < n; ++j) ring.push_back({j, (j + 1) % n});
    partial.push_back({n - 1, 0});
    auto x = inputs_f32(me, count);
    std::vector<float> y(count, -1.f);
    c.permute(x.data(), y.data(), count, DType::F32, ring);
    for (std::int64_t i = 0; i < count; ++i) ASSERT_EQ(y[i], input_f32(g[(r + n - 1) % n], i));
    c.permute(x.data(), y.data(), count, DType::F32, partial);
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_EQ(y[i], r == 0 ? input_f32(g[n - 1], i) : 0.f);
  }
  c.barrier();
}

// The nonblocking forms: same values as the blocking ones; several requests in flight on
// the group at once, a blocking call issued behind them, waited on out of issue order
// (and one completed by test()); counters count each call once.
inline void check_nonblocking_collectives(Communicator& c, std::int64_t count,
                                          bool exact = true) {
  auto same = [exact](float got, float want) {
    return exact ? got == want : std::abs(got - want) <= 1e-3f + 1e-5f * std::abs(want);
  };
  const int n = c.size(), r = c.rank();
  const auto& g = c.group();
  const int me = c.global_rank();
  auto x = inputs_f32(me, n * count);
  std::vector<float> sum(count, -1.f), mean(count, -1.f), gathered(n * count, -1.f),
      scattered(count, -1.f), inplace(x.begin(), x.begin() + count), blocking(count, -1.f);
  const CommStats before = c.stats();
  Request a = c.iall_reduce(x.data(), sum.data(), count, DType::F32, ReduceOp::Sum);
  Request b = c.iall_gather(x.data(), gathered.data(), count, DType::F32);
  Request d = c.ireduce_scatter(x.data(), scattered.data(), count, DType::F32, ReduceOp::Sum);
  Request e = c.iall_reduce(inplace.data(), inplace.data(), count, DType::F32, ReduceOp::Sum);
  c.all_reduce(x.data(), blocking.data(), count, DType::F32, ReduceOp::Max);  // behind them
  Request f = c.iall_reduce(x.data(), mean.data(), count, DType::F32, ReduceOp::Mean);
  f.wait();  // the last first
  d.wait();
  while (!b.test()) {
  }
  e.wait();
  a.wait();
  a.wait();  // a second wait is a no-op
  EXPECT_TRUE(a.test());
  auto want = host_sum_f32(g, count);
  auto want_rs = host_sum_f32(g, count, r * count);
  for (std::int64_t i = 0; i < count; ++i) {
    ASSERT_TRUE(same(sum[i], want[i])) << "isum i=" << i;
    ASSERT_TRUE(same(inplace[i], want[i])) << "in place i=" << i;
    ASSERT_TRUE(same(mean[i], want[i] / n)) << "imean i=" << i;
    ASSERT_TRUE(same(scattered[i], want_rs[i])) << "irs i=" << i;
    float m = input_f32(g[0], i);
    for (int j : g) m = std::max(m, input_f32(j, i));
    ASSERT_EQ(blocking[i], m) << "max i=" << i;
  }
  for (int j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_EQ(gathered[j * count + i], input_f32(g[j], i)) << "igather j=" << j;
  const CommStats& after = c.stats();
  EXPECT_EQ(after[OpKind::AllReduce].calls - before[OpKind::AllReduce].calls, 4);
  EXPECT_EQ(after[OpKind::AllGather].calls - before[OpKind::AllGather].calls, 1);
  EXPECT_EQ(after[OpKind::ReduceScatter].calls - before[OpKind::ReduceScatter].calls, 1);
  EXPECT_EQ(after[OpKind::AllGather].bytes_sent - before[OpKind::AllGather].bytes_sent,
            (n - 1) * count * 4);
  // A request dropped without wait completes in its destructor (and counts).
  { Request dropped = c.iall_reduce(x.data(), sum.data(), count, DType::F32, ReduceOp::Sum); }
  EXPECT_EQ(c.stats()[OpKind::AllReduce].calls - before[OpKind::AllReduce].calls, 5);
  c.barrier();
}

// The nonblocking forms of all_to_all, broadcast and permute: same values as the blocking
// ones; in flight together with a blocking call issued behind them, waited on out of issue
// order (one completed by test()); counters count each call once.
inline void check_nonblocking_exchanges(Communicator& c, std::int64_t count) {
  const int n = c.size(), r = c.rank();
  const auto& g = c.group();
  const int me = c.global_rank();
  const int root = n - 1;
  auto x = inputs_f32(me, n * count);
  std::vector<float> to_all(n * count, -1.f), shifted(count, -1.f), biggest(count, -1.f);
  std::vector<float> sent(x.begin(), x.begin() + count);  // broadcast in place
  std::vector<std::pair<int, int>> ring;
  for (int i = 0; i < n; ++i) ring.push_back({i, (i + 1) % n});
  const CommStats before = c.stats();
  Request a = c.iall_to_all(x.data(), to_all.data(), count, DType::F32);
  Request b = c.ibroadcast(sent.data(), count, DType::F32, root);
  Request p = c.ipermute(x.data(), shifted.data(), count, DType::F32, ring);
  c.all_reduce(x.data(), biggest.data(), count, DType::F32, ReduceOp::Max);  // behind them
  p.wait();  // the last first
  while (!b.test()) {
  }
  a.wait();
  for (int j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_EQ(to_all[j * count + i], input_f32(g[j], r * count + i)) << "ia2a j=" << j;
  for (std::int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(sent[i], input_f32(g[root], i)) << "ibroadcast i=" << i;
    ASSERT_EQ(shifted[i], input_f32(g[(r + n - 1) % n], i)) << "ipermute i=" << i;
    float m = input_f32(g[0], i);
    for (int j : g) m = std::max(m, input_f32(j, i));
    ASSERT_EQ(biggest[i], m) << "max i=" << i;
  }
  const CommStats& after = c.stats();
  EXPECT_EQ(after[OpKind::AllToAll].calls - before[OpKind::AllToAll].calls, 1);
  EXPECT_EQ(after[OpKind::Broadcast].calls - before[OpKind::Broadcast].calls, 1);
  EXPECT_EQ(after[OpKind::Permute].calls - before[OpKind::Permute].calls, 1);
  EXPECT_EQ(after[OpKind::AllReduce].calls - before[OpKind::AllReduce].calls, 1);
  c.barrier();
}

// The all-to-all of variable splits: device a sends `scale` x ((a + 2b) % 4) elements to
// device b (global ids; zero-length blocks included), element i of that block being
// input_f32(a, 1000 b + i). Blocking, then two non-blocking calls in flight waited on in
// reverse order (the second with the transposed counts, as a backward pass sends back);
// counted as all_to_all calls with the bytes that cross between devices.
inline void check_variable_exchanges(Communicator& c, std::int64_t scale) {
  const int n = c.size();
  const auto& g = c.group();
  const int me = c.global_rank();
  auto count = [&](int a, int b) { return scale * ((a + 2 * b) % 4); };
  auto build = [&](bool back) {
    std::vector<std::int64_t> send(n), recv(n);
    std::vector<float> x;
    for (int j = 0; j < n; ++j) {
      const int to = g[j];
      send[j] = back ? count(to, me) : count(me, to);
      recv[j] = back ? count(me, to) : count(to, me);
      for (std::int64_t i = 0; i < send[j]; ++i) x.push_back(input_f32(me, 1000 * to + i));
    }
    return std::make_tuple(send, recv, x);
  };
  auto expect = [&](const std::vector<float>& got, const std::vector<std::int64_t>& recv,
                    const char* what) {
    std::int64_t at = 0;
    for (int j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < recv[j]; ++i, ++at)
        ASSERT_EQ(got[static_cast<std::size_t>(at)], input_f32(g[j], 1000 * me + i))
            << what << " from rank " << j << " element " << i;
    ASSERT_EQ(at, static_cast<std::int64_t>(got.size())) << what;
  };
  ASSERT_TRUE(c.has_all_to_allv());
  const CommStats before = c.stats();
  auto [send, recv, x] = build(false);
  std::vector<float> y(static_cast<std::size_t>(std::accumulate(recv.begin(), recv.end(), 0LL)),
                       -1.f);
  c.all_to_allv(Buffer::host(x.data(), std::int64_t(x.size()), DType::F32), send,
                Buffer::host(y.data(), std::int64_t(y.size()), DType::F32), recv);
  expect(y, recv, "all_to_allv");
  auto [send2, recv2, x2] = build(true);
  std::vector<float> y1(y.size(), -1.f),
      y2(static_cast<std::size_t>(std::accumulate(recv2.begin(), recv2.end(), 0LL)), -1.f);
  Request a = c.iall_to_allv(Buffer::host(x.data(), std::int64_t(x.size()), DType::F32), send,
                             Buffer::host(y1.data(), std::int64_t(y1.size()), DType::F32), recv);
  Request b = c.iall_to_allv(Buffer::host(x2.data(), std::int64_t(x2.size()), DType::F32), send2,
                             Buffer::host(y2.data(), std::int64_t(y2.size()), DType::F32), recv2);
  b.wait();
  a.wait();
  expect(y1, recv, "iall_to_allv");
  std::int64_t at = 0;  // the transposed exchange: device j's block for this one
  for (int j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < recv2[j]; ++i, ++at)
      ASSERT_EQ(y2[static_cast<std::size_t>(at)], input_f32(g[j], 1000 * me + i))
          << "transposed from rank " << j;
  const CommStats& after = c.stats();
  EXPECT_EQ(after[OpKind::AllToAll].calls - before[OpKind::AllToAll].calls, 3);
  std::int64_t crossing = 0;  // elements this device sent to others, over the three calls
  for (int j = 0; j < n; ++j)
    if (g[j] != me) crossing += 2 * count(me, g[j]) + count(g[j], me);
  EXPECT_EQ(after[OpKind::AllToAll].bytes_sent - before[OpKind::AllToAll].bytes_sent,
            4 * crossing);
  c.barrier();
}

// Counters per group label on a world of an even number n of devices, relabelled "all"
// and split into pairs ("row": ranks {2i, 2i+1}) and columns ("col": the n/2 ranks of
// equal parity): each call counts under the label of the group it ran on, and the
// totals are the sum.
inline void check_stats_per_label(Communicator& world) {
  const int n = world.size(), r = world.rank();
  ASSERT_EQ(n % 2, 0) << "needs an even number of devices";
  ASSERT_EQ(world.label(), "world");
  world.set_label("all");
  CommStats& s = world.stats();
  s.reset();
  Communicator row = world.split(r / 2, r);
  EXPECT_EQ(row.label(), "all") << "a split keeps its parent's label until given its own";
  row.set_label("row");
  Communicator col = world.split(r % 2, r);
  col.set_label("col");
  const std::int64_t count = 1000, bytes = 4 * count;
  const int cols = n / 2;
  std::vector<float> x(n * count, 1.f), y(n * count);
  row.all_reduce(x.data(), y.data(), count, DType::F32, ReduceOp::Sum);
  row.all_reduce(x.data(), y.data(), count, DType::F32, ReduceOp::Sum);
  col.all_gather(x.data(), y.data(), count, DType::F32);
  col.reduce_scatter(x.data(), y.data(), count, DType::F32, ReduceOp::Sum);
  std::vector<std::pair<int, int>> ring;
  for (int j = 0; j < n; ++j) ring.push_back({j, (j + 1) % n});
  world.permute(x.data(), y.data(), count, DType::F32, ring);
  // Point-to-point with the other member of the pair.
  Request rr = row.irecv(y.data(), count, DType::F32, 1 - row.rank(), 5);
  Request sr = row.isend(x.data(), count, DType::F32, 1 - row.rank(), 5);
  sr.wait();
  rr.wait();

  // all_reduce over 2: 2(p-1)/p * B = B each way, twice.
  EXPECT_EQ(s.of("row", OpKind::AllReduce).calls, 2);
  EXPECT_EQ(s.of("row", OpKind::AllReduce).bytes_sent, 2 * bytes);
  EXPECT_EQ(s.of("row", OpKind::AllReduce).bytes_received, 2 * bytes);
  EXPECT_EQ(s.of("col", OpKind::AllReduce).calls, 0);
  EXPECT_EQ(s.of("all", OpKind::AllReduce).calls, 0);
  // all_gather and reduce_scatter over n/2: (p-1) * B.
  EXPECT_EQ(s.of("col", OpKind::AllGather).bytes_sent, (cols - 1) * bytes);
  EXPECT_EQ(s.of("col", OpKind::ReduceScatter).bytes_received, (cols - 1) * bytes);
  EXPECT_EQ(s.of("row", OpKind::AllGather).calls, 0);
  EXPECT_EQ(s.of("all", OpKind::Permute).bytes_sent, bytes);
  EXPECT_EQ(s.of("all", OpKind::Permute).bytes_received, bytes);
  EXPECT_EQ(s.of("all", OpKind::Split).calls, 2);  // splits run on the parent
  EXPECT_EQ(s.of("row", OpKind::Send).calls, 1);
  EXPECT_EQ(s.of("row", OpKind::Send).bytes_sent, bytes);
  EXPECT_EQ(s.of("row", OpKind::Recv).bytes_received, bytes);
  EXPECT_EQ(s.of("all", OpKind::Send).calls, 0);
  EXPECT_EQ(s.for_group("nope"), nullptr);
  EXPECT_EQ(s.of("nope", OpKind::AllReduce).calls, 0);
  auto labels = s.group_labels();
  EXPECT_EQ(std::set<std::string>(labels.begin(), labels.end()),
            (std::set<std::string>{"all", "row", "col"}));
  // The totals are the sum over the groups.
  for (int k = 0; k < kNumOpKinds; ++k) {
    OpCounters sum;
    for (const auto& l : labels) {
      const OpCounters c = s.of(l, static_cast<OpKind>(k));
      sum.calls += c.calls;
      sum.bytes_sent += c.bytes_sent;
      sum.bytes_received += c.bytes_received;
      sum.seconds += c.seconds;
    }
    const OpCounters& total = s[static_cast<OpKind>(k)];
    EXPECT_EQ(sum.calls, total.calls) << op_kind_name(static_cast<OpKind>(k));
    EXPECT_EQ(sum.bytes_sent, total.bytes_sent) << op_kind_name(static_cast<OpKind>(k));
    EXPECT_EQ(sum.bytes_received, total.bytes_received) << op_kind_name(static_cast<OpKind>(k));
    EXPECT_NEAR(sum.seconds, total.seconds, 1e-9 + 1e-9 * total.seconds);
  }
  EXPECT_GT(s.of("row", OpKind::AllReduce).seconds, 0.0);
  // reset() clears the groups too; a label in use keeps counting afterwards.
  s.reset();
  EXPECT_TRUE(s.group_labels().empty());
  EXPECT_EQ(s.of("row", OpKind::AllReduce).calls, 0);
  row.barrier();
  EXPECT_EQ(s.group_labels(), std::vector<std::string>{"row"});
  EXPECT_EQ(s[OpKind::Barrier].calls, 1);
}

}  // namespace distjax::comm::testing
