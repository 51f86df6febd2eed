// The storage allocator: alignment, reuse of cached large blocks, the cache bound, and the
// margin it keeps under an address-space limit.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "distjax/distjax.hpp"
#include "distjax/tensor/detail/allocator.hpp"

namespace distjax::tensor::detail {
namespace {

TEST(Allocator, BlocksAreAlignedAndWritable) {
  for (std::size_t n : {std::size_t(1), std::size_t(100), std::size_t(4096), std::size_t(70000),
                        std::size_t(3) << 20}) {
    void* p = cpu_alloc(n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << n;
    std::memset(p, 0xab, n);
    cpu_free(p, n);
  }
}

TEST(Allocator, LargeBlocksAreReusedAndSmallOnesAreNotCached) {
  if (kCacheCapacity == 0) GTEST_SKIP() << "the block cache is off under AddressSanitizer";
  cpu_release_cached();
  EXPECT_EQ(cpu_cached_bytes(), 0u);
  void* a = cpu_alloc(1 << 20);
  cpu_free(a, 1 << 20);
  EXPECT_GE(cpu_cached_bytes(), std::size_t(1) << 20);
  void* b = cpu_alloc((1 << 20) - 100);  // same size class
  EXPECT_EQ(a, b);
  EXPECT_EQ(cpu_cached_bytes(), 0u);
  cpu_free(b, (1 << 20) - 100);
  void* s = cpu_alloc(1000);
  cpu_free(s, 1000);
  EXPECT_EQ(cpu_cached_bytes(), std::size_t(1) << 20);  // the small block was not cached
  cpu_release_cached();
  EXPECT_EQ(cpu_cached_bytes(), 0u);
}

TEST(Allocator, CacheStaysWithinCapacity) {
  if (kCacheCapacity == 0) GTEST_SKIP() << "the block cache is off under AddressSanitizer";
  cpu_release_cached();
  const std::size_t block = kCacheCapacity / 4 + 4096;
  std::vector<void*> ps;
  for (int i = 0; i < 5; ++i)
    ps.push_back(cpu_alloc(block));
  for (void* p : ps)
    cpu_free(p, block);
  EXPECT_LE(cpu_cached_bytes(), kCacheCapacity);
  EXPECT_GT(cpu_cached_bytes(), 0u);
  cpu_release_cached();
}

TEST(Allocator, TensorsFromManyThreadsKeepTheirValues) {
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, &ok] {
      bool good = true;
      for (int i = 0; i < 200; ++i) {
        Tensor x = Tensor::full({300, 100}, double(t * 1000 + i));
        Tensor y = Tensor::full({200, 100}, double(-i));
        good = good && x.data<float>()[29999] == float(t * 1000 + i) &&
               y.data<float>()[0] == float(-i);
      }
      ok[t] = good;
    });
  for (auto& th : threads)
    th.join();
  for (int t = 0; t < 4; ++t)
    EXPECT_TRUE(ok[t]) << t;
}

// Under an address-space limit (ulimit -v), running out of memory leaves the process room to
// go on: after the clean out-of-memory error a thread starts (its stack is mapped) and a GEMM
// of a new shape runs (oneDNN maps its JIT code). Tensors that took the last of the address
// space left neither: the thread failed to start, oneDNN 2.6 segfaulted. In a child process
// of its own (gtest's death-test machinery), whose limit it lowers.
void exhaust_then_go_on() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long pages = 0;
  if (!f || std::fscanf(f, "%lu", &pages) != 1) std::_Exit(3);
  std::fclose(f);
  const auto mapped = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE));
  rlimit r{};
  getrlimit(RLIMIT_AS, &r);
  r.rlim_cur = mapped + (rlim_t(768) << 20);
  if (setrlimit(RLIMIT_AS, &r) != 0) std::_Exit(4);
  std::vector<Tensor> held;
  try {
    for (;;)
      held.push_back(Tensor::empty({1 << 20}, DType::F32));  // 4 MiB each
  } catch (const Error& e) {
    if (std::string(e.what()).find("out of memory") == std::string::npos) std::_Exit(5);
  }
  if (held.empty()) std::_Exit(6);
  try {
    std::thread t([] {});
    t.join();
  } catch (const std::system_error&) {
    std::_Exit(7);  // no room for a thread's stack
  }
  const Tensor a = Tensor::ones({37, 53}), b = Tensor::ones({53, 41});
  std::_Exit(tensor::sum(tensor::matmul(a, b)).item<float>() == 37.f * 41.f * 53.f ? 0 : 8);
}

TEST(AllocatorDeathTest, OutOfAddressSpaceLeavesRoomForThreadsAndKernels) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(exhaust_then_go_on(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace distjax::tensor::detail
