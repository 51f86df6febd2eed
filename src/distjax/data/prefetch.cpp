#include "distjax/data/prefetch.hpp"

#include <utility>

#include "distjax/core/device.hpp"

namespace distjax::data {

Prefetcher::Prefetcher(std::function<train::Batch(std::int64_t step)> make)
    : make_(std::move(make)), thread_([this] { work(); }) {}

Prefetcher::~Prefetcher() {
  {
    const std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Prefetcher::work() {
  const DeviceScope host(Device::cpu());
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || asked_.has_value(); });
    if (stop_) return;
    const std::int64_t step = *asked_;
    asked_.reset();
    lock.unlock();
    train::Batch batch;
    std::exception_ptr error;
    try {
      batch = make_(step);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    made_step_ = step;
    made_ = std::move(batch);
    error_ = error;
    cv_.notify_all();
  }
}

train::Batch Prefetcher::next(std::int64_t step) {
  std::unique_lock lock(mu_);
  asked_.reset();  // not started: made here, if it is the step asked for
  train::Batch batch;
  if (made_step_ == step) {
    made_step_.reset();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    batch = std::move(made_);
  } else {
    // Not made yet: made here rather than waited for (a busy machine may give the thread no
    // core until the step's work is done), so a step waits no longer than making its batch.
    // The thread's batch, when it comes, is dropped.
    lock.unlock();
    batch = make_(step);  // on this thread: its exceptions go straight to the caller
    lock.lock();
  }
  asked_ = step + 1;
  cv_.notify_all();
  return batch;
}

}  // namespace distjax::data
