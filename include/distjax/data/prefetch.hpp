// Batches made ahead on a host thread: while a step trains, the next step's batch is read
// (windows gathered from memory-mapped shards, pages faulted in), so the step does not
// wait for data.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "distjax/train/batch.hpp"

namespace distjax::data {

/// One host thread that makes the batch of the step after the one asked for, from a
/// function of the step alone (the data of step s follows from s: asking twice for a step
/// gives the same batch). The batch is made on the host (the thread's current device is
/// the CPU); the caller moves it where it trains. An exception of `make` is rethrown by
/// the next() that asks for that step. Destroying it waits for a batch in the making.
///
///   data::Prefetcher ahead([&](std::int64_t s) { return text.batch(s, replica, replicas, key); });
///   for (std::int64_t s = 0; s < steps; ++s) train(ahead.next(s));   // s + 1 made meanwhile
class Prefetcher {
 public:
  explicit Prefetcher(std::function<train::Batch(std::int64_t step)> make);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  /// The batch of `step`: the one made ahead when the last call asked for step - 1, else
  /// made now on this thread (the first step, a jump, or one the thread has not finished:
  /// a busy machine may have had no core for it; a step never waits longer than making
  /// its own batch); then asks the thread for step + 1.
  train::Batch next(std::int64_t step);

 private:
  void work();

  std::function<train::Batch(std::int64_t)> make_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::int64_t> asked_;  // the step the thread is to make, not started
  std::optional<std::int64_t> made_step_;
  train::Batch made_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it reads
};

}  // namespace distjax::data
