// Every collective and transfer of the threads backend on tensors of the launch's device:
// the CPU here, the checked device in the "checked" rerun, and one GPU shared by the
// simulated devices in the "gpu" rerun (DISTJAX_DEVICE=cuda through run_on_gpu). Results
// must equal the host's bit for bit (sums fold in rank order on every device kind), with
// sizes that take each path (fewer elements than devices, so some shares are empty; tails
// that are not a multiple of the vector width), and buffers written by a kernel just before
// the call, so a call that does not wait for the work queued before it reads stale data. A
// mismatched or missing device fails every device, naming the ops and devices, on device
// buffers as on host ones.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_test_util.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::comm {
namespace {

using tensor::Tensor;
using testing::input_f32;
using testing::inputs_f32;

LaunchOptions opts(int n) {
  LaunchOptions o;
  o.num_devices = n;
  o.timeout = std::chrono::milliseconds(60000);
  return o;
}

// Device r's input, written on the device by a kernel (x + 0 after an upload), so the
// call after it must wait for that kernel.
Tensor input_on_device(int r, std::int64_t count) {
  const Tensor x = Tensor::from_vector(inputs_f32(r, count), {count});
  return tensor::add(x, Tensor::zeros({count}));
}

std::vector<float> sum_over(int n, std::int64_t count, std::int64_t offset = 0) {
  std::vector<int> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  return testing::host_sum_f32(all, count, offset);
}

class DeviceBuffers : public ::testing::TestWithParam<int> {};

TEST_P(DeviceBuffers, EveryCollectiveEqualsTheHostBitForBit) {
  const int n = GetParam();
  launch(opts(n), [n](Communicator& c) {
    const int r = c.rank();
    const Device dev = current_device();
    for (std::int64_t count :
         {std::int64_t(3), std::int64_t(5), std::int64_t(4099), std::int64_t(1) << 16}) {
      SCOPED_TRACE("count " + std::to_string(count) + " on " + dev.str());
      const Tensor x = input_on_device(r, count);
      ASSERT_EQ(x.device(), dev);
      const std::vector<float> sum = sum_over(n, count);

      Tensor y = Tensor::empty({count});
      c.all_reduce(buffer_of(x), buffer_of(y), ReduceOp::Sum);
      EXPECT_EQ(y.to_vector<float>(), sum);
      Tensor in_place = tensor::add(x, Tensor::zeros({count}));
      c.iall_reduce(buffer_of(in_place), buffer_of(in_place), ReduceOp::Sum).wait();
      EXPECT_EQ(in_place.to_vector<float>(), sum);
      c.all_reduce(buffer_of(x), buffer_of(y), ReduceOp::Mean);
      std::vector<float> mean(sum);
      for (float& v : mean) v /= static_cast<float>(n);
      EXPECT_EQ(y.to_vector<float>(), mean);
      c.all_reduce(buffer_of(x), buffer_of(y), ReduceOp::Max);
      std::vector<float> max(count);
      for (std::int64_t i = 0; i < count; ++i) {
        max[i] = input_f32(0, i);
        for (int j = 1; j < n; ++j) max[i] = input_f32(j, i) > max[i] ? input_f32(j, i) : max[i];
      }
      EXPECT_EQ(y.to_vector<float>(), max);

      // bf16 in, f32 accumulation, one rounding: the host's arithmetic.
      const Tensor xh = tensor::astype(x, DType::BF16);
      Tensor yh = Tensor::empty({count}, DType::BF16);
      c.all_reduce(buffer_of(xh), buffer_of(yh), ReduceOp::Sum);
      std::vector<float> want_h(count);
      for (std::int64_t i = 0; i < count; ++i) {
        float acc = static_cast<float>(bf16(input_f32(0, i)));
        for (int j = 1; j < n; ++j) acc += static_cast<float>(bf16(input_f32(j, i)));
        want_h[i] = static_cast<float>(bf16(acc));
      }
      EXPECT_EQ(tensor::astype(yh, DType::F32).to_vector<float>(), want_h);

      Tensor gathered = Tensor::empty({n, count});
      c.iall_gather(buffer_of(x), buffer_of(gathered)).wait();
      for (int j = 0; j < n; ++j)
        EXPECT_EQ(gathered.view_rows(j, j + 1).to_vector<float>(), inputs_f32(j, count));

      const std::int64_t block = count / n;
      const Tensor blocks = input_on_device(r, block * n);
      Tensor mine = Tensor::empty({block});
      c.ireduce_scatter(buffer_of(blocks), buffer_of(mine), ReduceOp::Sum).wait();
      EXPECT_EQ(mine.to_vector<float>(), sum_over(n, block, r * block));

      Tensor swapped = Tensor::empty({block * n});
      c.all_to_all(buffer_of(blocks), buffer_of(swapped));
      for (int j = 0; j < n; ++j) {
        const std::vector<float> from_j = inputs_f32(j, block * n);
        const std::vector<float> got = swapped.to_vector<float>();
        for (std::int64_t i = 0; i < block; ++i)
          ASSERT_EQ(got[j * block + i], from_j[r * block + i]) << "from " << j << " at " << i;
      }

      // Variable splits: device a sends ((a + 2b) % 3) blocks to device b (none where the
      // block is empty: fewer elements than devices).
      auto splits = [&](int a) {
        std::vector<std::int64_t> to(n);
        for (int j = 0; j < n; ++j) to[j] = ((a + 2 * j) % 3) * block;
        return to;
      };
      auto total = [](const std::vector<std::int64_t>& v) {
        std::int64_t t = 0;
        for (std::int64_t k : v) t += k;
        return t;
      };
      std::vector<std::int64_t> from(n);
      for (int j = 0; j < n; ++j) from[j] = splits(j)[r];
      const Tensor ragged = input_on_device(r, total(splits(r)));
      Tensor gathered_v = Tensor::empty({total(from)});
      c.iall_to_allv(buffer_of(ragged), splits(r), buffer_of(gathered_v), from).wait();
      const std::vector<float> got_v = gathered_v.to_vector<float>();
      for (int j = 0, at = 0; j < n; ++j) {
        std::int64_t offset = 0;  // where device j's block for this device starts
        for (int k = 0; k < r; ++k) offset += splits(j)[k];
        const std::vector<float> sent = inputs_f32(j, total(splits(j)));
        for (std::int64_t i = 0; i < from[j]; ++i, ++at)
          ASSERT_EQ(got_v[at], sent[offset + i]) << "variable split from " << j << " at " << i;
      }

      Tensor b = r == n - 1 ? input_on_device(r, count) : Tensor::zeros({count});
      c.broadcast(buffer_of(b), n - 1);
      EXPECT_EQ(b.to_vector<float>(), inputs_f32(n - 1, count));

      // A shift by one where the last device sends nothing: device 0 receives zeros.
      std::vector<std::pair<int, int>> shift;
      for (int i = 0; i + 1 < n; ++i) shift.emplace_back(i, i + 1);
      Tensor shifted = Tensor::full({count}, 7.0);
      c.permute(buffer_of(x), buffer_of(shifted), shift);
      EXPECT_EQ(shifted.to_vector<float>(),
                r == 0 ? std::vector<float>(count, 0.f) : inputs_f32(r - 1, count));

      const int left = (r + n - 1) % n, right = (r + 1) % n;
      Tensor received = Tensor::full({count}, 7.0);
      Request rr = c.irecv(buffer_of(received), left, 5);
      Request sr = c.isend(buffer_of(x), right, 5);
      sr.wait();
      rr.wait();
      EXPECT_EQ(received.to_vector<float>(), inputs_f32(left, count));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceBuffers, ::testing::Values(1, 2, 4));

// Sub-groups (a split per mesh axis) move device buffers too.
TEST(DeviceBuffers, SplitGroupsReduceTheirMembers) {
  launch(opts(4), [](Communicator& world) {
    const int r = world.rank();
    Communicator pair = world.split(r / 2, r);
    const std::int64_t count = 3001;
    const Tensor x = input_on_device(r, count);
    Tensor y = Tensor::empty({count});
    pair.all_reduce(buffer_of(x), buffer_of(y), ReduceOp::Sum);
    EXPECT_EQ(y.to_vector<float>(), testing::host_sum_f32({r / 2 * 2, r / 2 * 2 + 1}, count));
  });
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Each device's CommError message from fn on n devices with this timeout ("" if none).
std::vector<std::string> device_errors(int n, int timeout_ms,
                                       const std::function<void(Communicator&)>& fn) {
  LaunchOptions o = opts(n);
  o.timeout = std::chrono::milliseconds(timeout_ms);
  return testing::run_failing(o, fn).device_msgs;
}

TEST(DeviceBuffers, AMismatchedCollectiveFailsEveryDeviceNamingOpsAndDevices) {
  const auto msgs = device_errors(4, 20000, [](Communicator& world) {
    const Tensor x = input_on_device(world.rank(), 16);
    Tensor y = Tensor::empty({64});
    if (world.rank() == 1)
      world.all_gather(buffer_of(x), buffer_of(y));
    else
      world.all_reduce(buffer_of(x), buffer_of(x), ReduceOp::Sum);
    ADD_FAILURE() << "device " << world.rank() << " passed a mismatched collective";
  });
  // Off the CPU the descriptors name the buffers' device kind too.
  const DeviceKind kind = current_device().kind;
  const std::string on =
      kind == DeviceKind::CPU ? ")" : std::string(", on ") + device_kind_name(kind) + ")";
  for (int d = 0; d < 4; ++d) {
    EXPECT_TRUE(has(msgs[d], "devices disagree at call #0 of group (0,1,2,3)")) << msgs[d];
    EXPECT_TRUE(has(msgs[d], "devices 0,2,3 called all_reduce(count=16, f32, sum" + on)) << msgs[d];
    EXPECT_TRUE(has(msgs[d], "device 1 called all_gather(count=16, f32" + on)) << msgs[d];
  }
}

TEST(DeviceBuffers, ADeviceThatNeverArrivesTimesTheOthersOutNamingIt) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto msgs = device_errors(4, 1000, [](Communicator& world) {
    Communicator pair = world.split(world.rank() / 2, 0);
    const Tensor x = input_on_device(world.rank(), 4099);
    if (world.rank() == 1) {
      // Late into a barrier of (0, 1), so the world's all_reduce times out first.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      pair.barrier();
    } else {
      world.all_reduce(buffer_of(x), buffer_of(x), ReduceOp::Sum);
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  for (int d : {0, 2, 3}) {
    EXPECT_TRUE(has(msgs[d], "[all_reduce] timed out after 1000 ms")) << d << ": " << msgs[d];
    EXPECT_TRUE(has(msgs[d], "device 1 did not arrive")) << d << ": " << msgs[d];
  }
  EXPECT_FALSE(msgs[1].empty()) << "device 1 did not fail";
}

}  // namespace
}  // namespace distjax::comm
