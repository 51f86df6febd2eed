// Private helpers shared by the backends: call descriptors of the flight recorder, the
// messages built from them, argument checks, byte counts, reductions and the link model.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "distjax/comm/communicator.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/tensor/host_access.hpp"

namespace distjax::comm::detail {

/// What one device called at one sequence number of one group. Plain data (exchanged
/// as bytes between MPI processes).
struct CallDesc {
  std::uint64_t seq = 0;
  std::int64_t count = 0;
  std::uint64_t pairs_hash = 0;  // permute: hash of the (src, dst) pairs
  std::int32_t root = 0;         // broadcast
  std::uint8_t op = 0;           // OpKind
  std::uint8_t dtype = 0;        // DType
  std::uint8_t reduce = 0;       // ReduceOp
  std::uint8_t device = 0;        // threads backend: the DeviceKind of the call's buffers
  bool operator==(const CallDesc& o) const;
};

CallDesc make_desc(std::uint64_t seq, OpKind op, std::int64_t count = 0, DType dtype = DType::F32,
                   ReduceOp reduce = ReduceOp::Sum, int root = 0, std::uint64_t pairs_hash = 0);
/// "all_reduce(count=16, f32, sum)".
std::string describe(const CallDesc& d);
/// "(0,1,2,3)" from global device ids.
std::string group_label(const std::vector<int>& members);
/// "0,2,3".
std::string join_ints(const std::vector<int>& v);
/// Empty when every descriptor equals the first; otherwise the mismatch message
/// "[a/b] devices disagree at call #k of group G: devices .. called ..; device .. called ..".
std::string mismatch_message(const std::vector<CallDesc>& descs, const std::vector<int>& members);

std::uint64_t hash_pairs(const std::vector<std::pair<int, int>>& pairs);
/// Throws InvalidArgument unless every pair is in range and no rank is twice a source or
/// twice a destination.
void check_pairs(const std::vector<std::pair<int, int>>& pairs, int size);
/// Throws InvalidArgument for a negative count or a null buffer with count > 0 (the
/// device is each backend's to check: HostBuffers for those that move memory on the host).
void check_buffer(const char* op, const Buffer& b);

/// Host access to one call's buffers (one or two), for a backend whose host code moves
/// them (threads, MPI): constructed before anything of the call happens, it refuses a
/// buffer on a device the host cannot reach (CUDA) with NotImplemented naming the op, the
/// device and `backend`, and holds a tensor::HostAccess on each buffer of the checked
/// device until it is destroyed, once the backend touches the buffers no more (a
/// blocking call's end; a non-blocking one's completion).
class HostBuffers {
 public:
  HostBuffers(const char* op, const char* backend, const Buffer& a);
  HostBuffers(const char* op, const char* backend, const Buffer& a, const Buffer& b);

 private:
  tensor::HostAccess a_, b_;
};
/// 64-bit hash of a descriptor (every field, the sequence number too): what the MPI
/// backend's per-call check compares instead of the descriptors themselves.
std::uint64_t hash_desc(const CallDesc& d);
/// Argument check of all_reduce / reduce_scatter: throws NotImplemented unless dtype is
/// one reduce_into handles (f32, bf16, f16, i32, i64, f64; a value outside DType would
/// otherwise reduce nothing), and InvalidArgument unless reduce is Sum, Mean or Max.
void check_reducible(const char* op, DType dtype, ReduceOp reduce);

/// Bytes sent (= received) by one device under the ring algorithm (see OpCounters), and
/// the number of message steps, for the link model and stats.
struct Traffic {
  std::int64_t sent = 0;
  std::int64_t received = 0;
  int steps = 0;
};
Traffic ring_traffic(OpKind op, std::int64_t block_bytes, int size, bool is_root = false);

/// In place on host memory: buf[i] /= divisor (Mean after a backend's Sum).
void divide_inplace(void* buf, std::int64_t n, DType dtype, int divisor);

/// What the link model charges for this traffic: steps x latency + bytes sent /
/// bandwidth (zero when it is off).
std::chrono::steady_clock::duration link_time(const LinkModel& link, const Traffic& t);

/// The counters of one call measured away from the device's thread (a nonblocking
/// collective run by a worker), added to its CommStats by the device's thread when the
/// call completes, so that CommStats stays single-threaded.
struct DeferredCount {
  bool set = false;
  OpKind kind = OpKind::Barrier;
  OpCounters delta;
  CommSpan span{};
  /// Adds the counters (if set) to `stats` under group index `group`, once.
  void apply(CommStats& stats, int group);
};

/// Measures one call of `c` for its CommStats, in the totals and under c's label: wall
/// time, wait time, bytes, optional span. With `defer`, the figures go there instead and
/// stats are not touched (the caller applies them on the device's thread).
class CallTimer {
 public:
  CallTimer(CommunicatorImpl& c, OpKind kind, const Traffic& traffic,
            DeferredCount* defer = nullptr,
            std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now());
  /// Every peer has arrived: what came before was waiting.
  void arrived();
  ~CallTimer();

 private:
  CommStats* stats_;
  DeferredCount* defer_;
  bool record_spans_;
  int group_;
  OpKind kind_;
  Traffic traffic_;
  std::chrono::steady_clock::time_point start_, arrived_;
  bool has_arrived_ = false;
};

/// Counts an isend / irecv of `c` when it is posted: one call, and its bytes unless the
/// peer is this rank itself.
void count_post(CommunicatorImpl& c, bool is_send, std::int64_t bytes, bool to_self);
/// Counts the wait of a transfer posted under group index `group`: all of it is waiting.
void count_wait(CommStats& stats, int group, bool is_send, double seconds);

/// Rewraps an exception thrown on device `device` so its message names the device,
/// keeping distjax error types; rethrows it.
[[noreturn]] void rethrow_with_device(std::exception_ptr e, int device);

/// OpenMP threads per device for `local_devices` devices in this process.
int intra_op_threads_for(const LaunchOptions& opts, int local_devices);
void set_intra_op_threads(int n);

/// Backends (threads/, mpi/ or mpi_stub/).
void launch_threads(const LaunchOptions& opts, const std::function<void(Communicator&)>& fn);
void launch_mpi(const LaunchOptions& opts, const std::function<void(Communicator&)>& fn);
bool mpi_available();
/// The NCCL backend (nccl/, or nccl_stub/, which throws NotImplemented saying why).
void launch_nccl(const LaunchOptions& opts, const std::function<void(Communicator&)>& fn);

}  // namespace distjax::comm::detail
