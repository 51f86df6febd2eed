// The storage allocator: alignment, reuse of cached large blocks, and the cache bound.
#include <gtest/gtest.h>

#include <cstdint>
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

}  // namespace
}  // namespace distjax::tensor::detail
