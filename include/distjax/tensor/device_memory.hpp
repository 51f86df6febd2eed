// Device memory as a communication backend moves it: copies, zero fills and rank-order
// reductions of raw blocks (pointers, not tensors), host transfers, waits and events, run
// through the kernel table of the blocks' device on the calling thread's stream. The
// threads backend moves simulated devices' buffers with these (device to device on one
// GPU); the MPI backend stages device buffers through host blocks with them. On the
// checked device each call opens the blocks it is given for exactly its duration, so a
// CPU machine runs the same code path a GPU does, and host code that touches a buffer
// outside these calls faults.
#pragma once

#include <cstddef>
#include <cstdint>

#include "distjax/core/device.hpp"
#include "distjax/core/dtype.hpp"

namespace distjax::tensor::raw {

/// The reductions of a collective: Mean is the sum divided by a divisor.
enum class Reduction : std::uint8_t { Sum, Mean, Max };

/// The most sources one reduce() folds.
inline constexpr int kMaxSources = 64;

// Every function below names `op` (the collective it serves) in its errors and in the
// checked device's fault report, and runs on `device`'s kernels: blocks of that device kind.
// The CPU's kernels serve the CPU and the checked device alike, so for either a call may
// mix host and checked blocks (each checked one is opened while the kernel runs).

/// nbytes from src to dst, both on `device`'s kind (several simulated devices' blocks of
/// one GPU reach each other). Ordered on the calling thread's stream: wait with
/// synchronize() before another thread relies on it.
void copy(const char* op, Device device, void* dst, const void* src, std::size_t nbytes);
/// nbytes of dst set to zero bytes (ordered like copy).
void zero(const char* op, Device device, void* dst, std::size_t nbytes);
/// dst[i] = srcs[0][i] op ... op srcs[k-1][i], i < n, folded left in source order (bf16
/// and f16 in f32, rounded once; Mean divides the sum by `divisor`): the same bits on every
/// device kind. 1 <= k <= kMaxSources; dst may alias a source. Ordered like copy.
void reduce(const char* op, Device device, void* dst, const void* const* srcs, int k,
            std::int64_t n, DType dtype, Reduction reduction, int divisor);
/// The same fold written to each of m destinations (1 <= m <= kMaxSources) in one pass; a
/// destination may alias a source at the same offset.
void reduce(const char* op, Device device, void* const* dsts, int m, const void* const* srcs,
            int k, std::int64_t n, DType dtype, Reduction reduction, int divisor);
/// nbytes from device memory to host memory, and back. to_host is complete on return;
/// from_host returns with host_src reusable and the device's copy ordered on the calling
/// thread's stream, like copy.
void to_host(const char* op, Device device, const void* src, void* host_dst, std::size_t nbytes);
void from_host(const char* op, Device device, const void* host_src, void* dst,
               std::size_t nbytes);
/// nbytes from device memory into host_dst, which must be a HostBlock's memory of that
/// device, queued on the calling thread's stream: complete once an Event recorded after it
/// is (at once where kernels run at once).
void to_host_async(const char* op, Device device, const void* src, void* host_dst,
                   std::size_t nbytes);
/// Returns when everything the calling thread queued on `device` is done.
void synchronize(const char* op, Device device);
/// n elements of src_dtype at src converted (rounded to nearest even) into dst_dtype at dst,
/// queued on `stream` (a stream handle of the device's runtime, e.g. a cudaStream_t; null:
/// the calling thread's stream), as every conversion of the library computes it.
void convert(const char* op, Device device, const void* src, DType src_dtype, void* dst,
             DType dst_dtype, std::int64_t n, void* stream = nullptr);

/// Marks the work the recording thread has queued on a device so far; another thread
/// waits for it before it reads or writes what that work produced. Empty (waits for
/// nothing) where kernels run at once (CPU, checked).
class Event {
 public:
  Event() = default;
  static Event record(const char* op, Device device);
  /// Returns once the marked work is done (at most once; later calls return at once).
  void wait();
  /// The calling thread's stream waits for the marked work on the device; the host goes on
  /// at once and the event stays (several threads may order their streams on it, as long
  /// as it lives). Nothing for an empty event.
  void stream_wait() const;
  /// Whether the marked work is done, without waiting (true for an empty event).
  bool done() const;
  /// Whether it marks nothing (recorded where kernels run at once, or moved from).
  bool empty() const { return handle_ == nullptr; }
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

 private:
  Device device_{};
  const char* op_ = "";
  void* handle_ = nullptr;
};

/// Host memory that `device` copies to and from at full speed (page-locked for a GPU,
/// plain for the CPU), released when destroyed.
class HostBlock {
 public:
  HostBlock() = default;
  HostBlock(const char* op, Device device, std::size_t nbytes);
  ~HostBlock();
  HostBlock(HostBlock&& o) noexcept;
  HostBlock& operator=(HostBlock&& o) noexcept;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  void* data() const { return data_; }
  std::size_t size() const { return nbytes_; }

 private:
  Device device_{};
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
};

}  // namespace distjax::tensor::raw
