// The CUDA half of tensor/device_memory.hpp, what the communication backends move device
// memory with (label "gpu"; skips without a GPU, fails under DISTJAX_REQUIRE_GPU=1):
// rank-order reductions of several blocks of the GPU against the CPU's bit for bit (every
// dtype, op and source count, misaligned and in-place destinations, the vector path and
// its tail), copies and zero fills, events that order one thread's work before another
// thread's, and page-locked host blocks.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/tensor/device_memory.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/tensor.hpp"
#include "gpu/gpu_test.hpp"

namespace {

using namespace distjax;
using tensor::Tensor;
namespace raw = tensor::raw;

const Device kGpu{DeviceKind::CUDA, 0};

// n elements of dtype with mixed magnitudes (so the order of the sum shows in the bits),
// as raw bytes on the host.
std::vector<char> host_values(DType dtype, std::int64_t n, std::uint64_t seed) {
  std::vector<float> f(static_cast<std::size_t>(n));
  random_uniform(Key::from_seed(seed), f.data(), n, -100.f, 100.f);
  for (std::int64_t i = 0; i < n; i += 7) f[i] *= 1e-3f;
  std::vector<char> out(static_cast<std::size_t>(n) * dtype_size(dtype));
  for (std::int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::F32: reinterpret_cast<float*>(out.data())[i] = f[i]; break;
      case DType::F64: reinterpret_cast<double*>(out.data())[i] = f[i] * 1.000000123; break;
      case DType::I32: reinterpret_cast<std::int32_t*>(out.data())[i] = static_cast<std::int32_t>(f[i] * 1000); break;
      case DType::I64: reinterpret_cast<std::int64_t*>(out.data())[i] = static_cast<std::int64_t>(f[i] * 1e6); break;
      case DType::BF16: reinterpret_cast<bf16*>(out.data())[i] = bf16(f[i]); break;
      case DType::F16: reinterpret_cast<f16*>(out.data())[i] = f16(f[i] * 0.01f); break;
    }
  }
  return out;
}

TEST(CudaDeviceMemory, ReductionsEqualTheCpusBitForBit) {
  SKIP_WITHOUT_GPU();
  DeviceScope on(kGpu);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::I64}) {
    const std::size_t es = dtype_size(dtype);
    for (std::int64_t n : {std::int64_t(1), std::int64_t(37), std::int64_t(4096), std::int64_t(100003)}) {
      for (int k : {1, 2, 3, 8}) {
        for (int offset : {0, 1}) {  // 1: no pointer 16-byte aligned (the scalar kernel)
          for (raw::Reduction op : {raw::Reduction::Sum, raw::Reduction::Mean, raw::Reduction::Max}) {
            SCOPED_TRACE(std::string(dtype_name(dtype)) + " n " + std::to_string(n) + " k " +
                         std::to_string(k) + " offset " + std::to_string(offset) + " op " +
                         std::to_string(static_cast<int>(op)));
            const std::size_t bytes = static_cast<std::size_t>(n + offset) * es;
            std::vector<std::vector<char>> host;
            std::vector<Tensor> blocks;  // device memory, freed at scope end
            std::vector<const void*> cpu_srcs, gpu_srcs;
            for (int j = 0; j < k; ++j) {
              host.push_back(host_values(dtype, n + offset, 100 * j + n));
              blocks.push_back(Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::F32, kGpu));
              raw::from_host("test", kGpu, host[j].data(), blocks[j].raw_data(), bytes);
              cpu_srcs.push_back(host[j].data() + offset * es);
              gpu_srcs.push_back(static_cast<char*>(blocks[j].raw_data()) + offset * es);
            }
            std::vector<char> want(bytes), got(bytes);
            raw::reduce("test", Device::cpu(), want.data() + offset * es, cpu_srcs.data(), k, n,
                        dtype, op, k);
            Tensor dst = Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::F32, kGpu);
            raw::reduce("test", kGpu, static_cast<char*>(dst.raw_data()) + offset * es,
                        gpu_srcs.data(), k, n, dtype, op, k);
            raw::to_host("test", kGpu, static_cast<char*>(dst.raw_data()) + offset * es,
                         got.data() + offset * es, static_cast<std::size_t>(n) * es);
            ASSERT_EQ(std::memcmp(want.data() + offset * es, got.data() + offset * es,
                                  static_cast<std::size_t>(n) * es),
                      0);
            // An all-reduce's share: written to every source's block (in place) and to dst
            // again (cleared first), in one pass.
            raw::zero("test", kGpu, dst.raw_data(), bytes);
            std::vector<void*> dsts;
            for (const void* p : gpu_srcs) dsts.push_back(const_cast<void*>(p));
            dsts.push_back(static_cast<char*>(dst.raw_data()) + offset * es);
            raw::reduce("test", kGpu, dsts.data(), static_cast<int>(dsts.size()),
                        gpu_srcs.data(), k, n, dtype, op, k);
            for (void* p : dsts) {
              raw::to_host("test", kGpu, p, got.data() + offset * es,
                           static_cast<std::size_t>(n) * es);
              ASSERT_EQ(std::memcmp(want.data() + offset * es, got.data() + offset * es,
                                    static_cast<std::size_t>(n) * es),
                        0);
            }
          }
        }
      }
    }
  }
}

TEST(CudaDeviceMemory, CopiesZerosEventsAndHostBlocks) {
  SKIP_WITHOUT_GPU();
  DeviceScope on(kGpu);
  const std::int64_t n = (1 << 20) + 3;
  const Tensor a = Tensor::full({n}, 2.5);
  Tensor b = Tensor::empty({n});
  raw::copy("test", kGpu, b.raw_data(), a.raw_data(), static_cast<std::size_t>(n) * 4);
  raw::synchronize("test", kGpu);
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(n, 2.5f));
  raw::zero("test", kGpu, b.raw_data(), static_cast<std::size_t>(n) * 4);
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(n, 0.f));

  // Work queued on this thread's stream, then read by another thread's stream once it has
  // waited for the event: it sees the finished work.
  Tensor c = tensor::add(a, Tensor::full({n}, 1.0));  // 3.5, queued on this stream
  raw::Event ready = raw::Event::record("test", kGpu);
  raw::HostBlock host("test", kGpu, static_cast<std::size_t>(n) * 4);
  std::thread reader([&] {
    ready.wait();
    raw::to_host("test", kGpu, c.raw_data(), host.data(), static_cast<std::size_t>(n) * 4);
  });
  reader.join();
  const float* h = static_cast<const float*>(host.data());
  EXPECT_EQ(std::vector<float>(h, h + n), std::vector<float>(n, 3.5f));
  // A released block comes back from the cache.
  void* first = host.data();
  host = raw::HostBlock();
  raw::HostBlock again("test", kGpu, static_cast<std::size_t>(n) * 4);
  EXPECT_EQ(again.data(), first);
}

// Host-to-device copies return before the transfer lands (staged through page-locked
// slots): the host buffer is reusable at once, the device copy is right in the stream's
// order, and more copies in flight than there are slots wait for one rather than overwrite
// it. A kernel queued first (a long fill) keeps the transfers behind it.
TEST(CudaDeviceMemory, HostToDeviceCopiesReturnAtOnceWithTheHostBufferReusable) {
  SKIP_WITHOUT_GPU();
  DeviceScope on(kGpu);
  const std::int64_t n = 100003;
  std::vector<float> host(static_cast<std::size_t>(n));
  std::vector<Tensor> copies;
  Tensor busy = Tensor::full({std::int64_t(1) << 26}, 1.f, DType::F32, kGpu);
  for (int round = 0; round < 150; ++round) {  // beyond the 64 slots
    for (std::int64_t i = 0; i < n; ++i) host[static_cast<std::size_t>(i)] = float(round * n + i);
    copies.push_back(Tensor::from_vector(host, {n}, Device::cpu()).to(kGpu));
    std::fill(host.begin(), host.end(), -1.f);  // the host's buffer, reused at once
  }
  for (int round = 0; round < 150; ++round) {
    const std::vector<float> got = copies[static_cast<std::size_t>(round)].to_vector<float>();
    for (std::int64_t i = 0; i < n; i += 997)
      ASSERT_EQ(got[static_cast<std::size_t>(i)], float(round * n + i)) << "copy " << round;
  }
  EXPECT_EQ(busy.to_vector<float>()[12345], 1.f);
}

}  // namespace
