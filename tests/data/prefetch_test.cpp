// data::Prefetcher: the batches of a function of the step, made ahead on a host thread.
#include "distjax/data/prefetch.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace distjax;

namespace {

// A batch that says its step: inputs (1, 1) = step, labels (1, 1) = -step.
train::Batch batch_of(std::int64_t step) {
  const auto s = static_cast<std::int32_t>(step);
  return {tensor::Tensor::from_vector(std::vector<std::int32_t>{s}, {1, 1}),
          tensor::Tensor::from_vector(std::vector<std::int32_t>{-s}, {1, 1})};
}

std::int32_t step_of(const train::Batch& b) { return b.inputs.to_vector<std::int32_t>()[0]; }

}  // namespace

TEST(Prefetcher, HandsEachStepItsOwnBatchInOrderAndAfterAJump) {
  data::Prefetcher ahead(batch_of);
  for (std::int64_t s = 0; s < 20; ++s) EXPECT_EQ(step_of(ahead.next(s)), s);
  // A resume elsewhere, and a step asked twice: the function of the step decides.
  EXPECT_EQ(step_of(ahead.next(100)), 100);
  EXPECT_EQ(step_of(ahead.next(100)), 100);
  EXPECT_EQ(step_of(ahead.next(7)), 7);
}

TEST(Prefetcher, HandsOverTheBatchItsThreadMadeAhead) {
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<std::int64_t> done{-1};
  // Labels say who made the batch: 1 the prefetching thread, 0 the caller.
  data::Prefetcher ahead([&](std::int64_t s) {
    const std::int32_t by_thread = std::this_thread::get_id() != caller ? 1 : 0;
    train::Batch b = {batch_of(s).inputs,
                      tensor::Tensor::from_vector(std::vector<std::int32_t>{by_thread}, {1, 1})};
    done = s;
    return b;
  });
  std::vector<std::int32_t> by_thread;
  for (std::int64_t s = 0; s < 5; ++s) {
    const train::Batch b = ahead.next(s);
    EXPECT_EQ(step_of(b), s);
    by_thread.push_back(b.labels.to_vector<std::int32_t>()[0]);
    // The "step": long enough for the thread to make s + 1.
    for (int i = 0; i < 2000 && done.load() != s + 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Step 0 is made by the caller; 1 to 4 were made ahead and ready when asked for.
  EXPECT_EQ(by_thread, (std::vector<std::int32_t>{0, 1, 1, 1, 1}));
}

TEST(Prefetcher, AnErrorReachesTheStepThatAskedForIt) {
  std::atomic<std::int64_t> done{-1};
  data::Prefetcher ahead([&](std::int64_t s) {
    done = s;
    if (s == 3) throw std::runtime_error("no batch 3");
    return batch_of(s);
  });
  for (std::int64_t s = 0; s < 3; ++s) EXPECT_EQ(step_of(ahead.next(s)), s);
  for (int i = 0; i < 2000 && done.load() != 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_THROW(ahead.next(3), std::runtime_error);
  // Made on the caller's thread, a step's error is thrown there too.
  EXPECT_THROW(ahead.next(3), std::runtime_error);
  EXPECT_EQ(step_of(ahead.next(4)), 4);
}
