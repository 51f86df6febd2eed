// Shared helpers of the communicator backends (see call.hpp).
#include "distjax/comm/detail/call.hpp"

#include <omp.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <thread>

#include "distjax/core/error.hpp"
#include "distjax/tensor/device_memory.hpp"
#include "distjax/tensor/host_access.hpp"

namespace distjax::comm::detail {

bool CallDesc::operator==(const CallDesc& o) const {
  return seq == o.seq && count == o.count && pairs_hash == o.pairs_hash && root == o.root &&
         op == o.op && dtype == o.dtype && reduce == o.reduce && device == o.device;
}

CallDesc make_desc(std::uint64_t seq, OpKind op, std::int64_t count, DType dtype, ReduceOp reduce,
                   int root, std::uint64_t pairs_hash) {
  CallDesc d;
  d.seq = seq;
  d.op = static_cast<std::uint8_t>(op);
  d.count = count;
  d.dtype = static_cast<std::uint8_t>(dtype);
  d.reduce = static_cast<std::uint8_t>(reduce);
  d.root = root;
  d.pairs_hash = pairs_hash;
  return d;
}

std::string describe(const CallDesc& d) {
  auto op = static_cast<OpKind>(d.op);
  std::ostringstream os;
  os << op_kind_name(op);
  if (op == OpKind::Barrier || op == OpKind::Split) return os.str() + "()";
  os << "(count=" << d.count << ", " << dtype_name(static_cast<DType>(d.dtype));
  if (op == OpKind::AllReduce || op == OpKind::ReduceScatter)
    os << ", " << reduce_op_name(static_cast<ReduceOp>(d.reduce));
  if (op == OpKind::Broadcast) os << ", root=" << d.root;
  if (op == OpKind::Permute) os << ", pairs#" << std::hex << (d.pairs_hash & 0xffff) << std::dec;
  if (d.device != 0) os << ", on " << device_kind_name(static_cast<DeviceKind>(d.device));
  os << ")";
  return os.str();
}

std::string join_ints(const std::vector<int>& v) {
  std::ostringstream os;
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}

std::string group_label(const std::vector<int>& members) {
  std::string s = "(";  // appended, not operator+: g++ 12 warns falsely (-Wrestrict) there
  s.append(join_ints(members));
  s.push_back(')');
  return s;
}

std::string mismatch_message(const std::vector<CallDesc>& descs,
                             const std::vector<int>& members) {
  bool same = std::all_of(descs.begin(), descs.end(), [&](const CallDesc& d) {
    return d == descs[0];
  });
  if (same) return {};
  // Group the devices by what they called, in order of first appearance.
  std::vector<std::pair<std::string, std::vector<int>>> variants;
  std::vector<std::string> ops;
  for (std::size_t r = 0; r < descs.size(); ++r) {
    std::string what = describe(descs[r]);
    if (descs[r].seq != descs[0].seq) what += " as call #" + std::to_string(descs[r].seq);
    auto it = std::find_if(variants.begin(), variants.end(),
                           [&](const auto& v) { return v.first == what; });
    if (it == variants.end()) {
      variants.push_back({what, {members[r]}});
    } else {
      it->second.push_back(members[r]);
    }
    std::string name = op_kind_name(static_cast<OpKind>(descs[r].op));
    if (std::find(ops.begin(), ops.end(), name) == ops.end()) ops.push_back(name);
  }
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < ops.size(); ++i) os << (i ? "/" : "") << ops[i];
  os << "] devices disagree at call #" << descs[0].seq << " of group " << group_label(members)
     << ": ";
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const auto& [what, devs] = variants[i];
    os << (i ? "; " : "") << (devs.size() == 1 ? "device " : "devices ") << join_ints(devs)
       << " called " << what;
  }
  return os.str();
}

std::uint64_t hash_pairs(const std::vector<std::pair<int, int>>& pairs) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the pairs, order-insensitive
  std::vector<std::pair<int, int>> sorted(pairs);
  std::sort(sorted.begin(), sorted.end());
  for (auto [s, d] : sorted) {
    for (int v : {s, d}) {
      h ^= static_cast<std::uint32_t>(v);
      h *= 1099511628211ull;
    }
  }
  return h;
}

void check_pairs(const std::vector<std::pair<int, int>>& pairs, int size) {
  std::set<int> srcs, dsts;
  for (auto [s, d] : pairs) {
    DISTJAX_CHECK(s >= 0 && s < size && d >= 0 && d < size, InvalidArgument,
                  "[permute] pair (", s, ", ", d, ") is out of range for a group of ", size);
    DISTJAX_CHECK(srcs.insert(s).second, InvalidArgument, "[permute] rank ", s,
                  " is the source of more than one pair");
    DISTJAX_CHECK(dsts.insert(d).second, InvalidArgument, "[permute] rank ", d,
                  " is the destination of more than one pair");
  }
}

void check_buffer(const char* op, const Buffer& b) {
  DISTJAX_CHECK(b.count >= 0, InvalidArgument, "[", op, "] count must be >= 0, got ", b.count);
  DISTJAX_CHECK(b.data != nullptr || b.count == 0, InvalidArgument, "[", op,
                "] null buffer for count ", b.count);
}

namespace {
tensor::HostAccess host_access(const char* op, const char* backend, const Buffer& b) {
  DISTJAX_CHECK(tensor::host_reachable(b.device), NotImplemented, "[", op, "] buffers on ",
                b.device.str(), " are out of reach of the ", backend,
                " backend, which moves memory the host reaches (cpu, checked)");
  return tensor::HostAccess(op, b.device, b.data, static_cast<std::size_t>(b.bytes()));
}
}  // namespace

HostBuffers::HostBuffers(const char* op, const char* backend, const Buffer& a)
    : a_(host_access(op, backend, a)), b_(op, Device::cpu(), nullptr, 0) {}

HostBuffers::HostBuffers(const char* op, const char* backend, const Buffer& a, const Buffer& b)
    : a_(host_access(op, backend, a)), b_(host_access(op, backend, b)) {}

std::uint64_t hash_desc(const CallDesc& d) {
  // Word at a time (it runs on every checked call): each field is folded in with a
  // multiply and mixed at the end (splitmix64's finaliser).
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 0xbf58476d1ce4e5b9ull; };
  mix(d.seq);
  mix(static_cast<std::uint64_t>(d.count));
  mix(d.pairs_hash);
  mix(static_cast<std::uint32_t>(d.root) |
      (std::uint64_t(d.op) << 32 | std::uint64_t(d.dtype) << 40 | std::uint64_t(d.reduce) << 48 |
       std::uint64_t(d.device) << 56));
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  return h;
}

void check_reducible(const char* op, DType dtype, ReduceOp reduce) {
  bool dtype_ok = false;
  switch (dtype) {  // no default: a new DType warns here until reduce_into handles it
    case DType::F32:
    case DType::BF16:
    case DType::F16:
    case DType::I32:
    case DType::I64:
    case DType::F64:
      dtype_ok = true;
      break;
  }
  DISTJAX_CHECK(dtype_ok, NotImplemented, "[", op,
                "] expected a reducible dtype (f32, bf16, f16, i32, i64, f64), got dtype value ",
                static_cast<int>(dtype));
  bool reduce_ok = false;
  switch (reduce) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
    case ReduceOp::Max:
      reduce_ok = true;
      break;
  }
  DISTJAX_CHECK(reduce_ok, InvalidArgument, "[", op,
                "] expected a reduce op (sum, mean, max), got value ", static_cast<int>(reduce));
}

Traffic ring_traffic(OpKind op, std::int64_t b, int p, bool is_root) {
  Traffic t;
  if (p <= 1) return t;
  switch (op) {
    case OpKind::AllReduce:
      t.sent = t.received = 2 * (p - 1) * b / p;
      t.steps = 2 * (p - 1);
      break;
    case OpKind::AllGather:
    case OpKind::ReduceScatter:
    case OpKind::AllToAll:
      t.sent = t.received = (p - 1) * b;
      t.steps = p - 1;
      break;
    case OpKind::Broadcast:
      t.sent = is_root ? b : 0;
      t.received = is_root ? 0 : b;
      t.steps = 1;
      break;
    case OpKind::Barrier:
    case OpKind::Split:
      t.steps = 1;
      break;
    default:
      break;
  }
  return t;
}

void divide_inplace(void* buf, std::int64_t n, DType dtype, int divisor) {
  const void* srcs[1] = {buf};
  tensor::raw::reduce("divide", Device::cpu(), buf, srcs, 1, n, dtype, tensor::raw::Reduction::Mean,
                      divisor);
}

std::chrono::steady_clock::duration link_time(const LinkModel& link, const Traffic& t) {
  if (!link.enabled()) return {};
  double us = t.steps * link.latency_us;
  if (link.bandwidth_gbps > 0) us += static_cast<double>(t.sent) / (link.bandwidth_gbps * 1e3);
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::micro>(us));
}

void DeferredCount::apply(CommStats& stats, int group) {
  if (!set) return;
  set = false;
  stats.add(group, kind, delta);
  if (stats.record_spans) stats.spans.push_back(span);
}

CallTimer::CallTimer(CommunicatorImpl& c, OpKind kind, const Traffic& traffic,
                     DeferredCount* defer, std::chrono::steady_clock::time_point start)
    : stats_(defer ? nullptr : &c.stats()),
      defer_(defer),
      // Deferred: spans are always measured (cheap); apply() keeps them if wanted.
      record_spans_(defer ? true : c.stats().record_spans),
      group_(defer ? -1 : c.stats_group()),
      kind_(kind),
      traffic_(traffic),
      start_(start) {}

void CallTimer::arrived() {
  arrived_ = std::chrono::steady_clock::now();
  has_arrived_ = true;
}

CallTimer::~CallTimer() {
  auto end = std::chrono::steady_clock::now();
  if (!has_arrived_) arrived_ = end;
  const OpCounters delta{.calls = 1,
                         .bytes_sent = traffic_.sent,
                         .bytes_received = traffic_.received,
                         .seconds = std::chrono::duration<double>(end - start_).count(),
                         .wait_seconds = std::chrono::duration<double>(arrived_ - start_).count()};
  const CommSpan span{kind_, start_, arrived_, end, traffic_.sent};
  if (defer_) {
    *defer_ = {.set = true, .kind = kind_, .delta = delta, .span = span};
    return;
  }
  stats_->add(group_, kind_, delta);
  if (record_spans_) stats_->spans.push_back(span);
}

void count_post(CommunicatorImpl& c, bool is_send, std::int64_t bytes, bool to_self) {
  const std::int64_t moved = to_self ? 0 : bytes;
  c.stats().add(
      c.stats_group(), is_send ? OpKind::Send : OpKind::Recv,
      {.calls = 1, .bytes_sent = is_send ? moved : 0, .bytes_received = is_send ? 0 : moved});
}

void count_wait(CommStats& stats, int group, bool is_send, double seconds) {
  stats.add(group, is_send ? OpKind::Send : OpKind::Recv,
            {.seconds = seconds, .wait_seconds = seconds});
}

namespace {
template <class E>
bool try_rewrap(const std::exception& e, const std::string& suffix) {
  if (auto* p = dynamic_cast<const E*>(&e)) throw E(std::string(p->what()) + suffix);
  return false;
}
}  // namespace

void rethrow_with_device(std::exception_ptr ep, int device) {
  const std::string suffix = " (raised on device " + std::to_string(device) + ")";
  try {
    std::rethrow_exception(ep);
  } catch (const Error& e) {
    // Most derived first.
    try_rewrap<CommError>(e, suffix);
    try_rewrap<InvalidArgument>(e, suffix);
    try_rewrap<ShardingError>(e, suffix);
    try_rewrap<ConfigError>(e, suffix);
    try_rewrap<NotImplemented>(e, suffix);
    try_rewrap<IoError>(e, suffix);
    throw Error(std::string(e.what()) + suffix);
  } catch (const std::exception& e) {
    throw Error("[launch] device " + std::to_string(device) + " raised: " + e.what());
  } catch (...) {
    throw Error("[launch] device " + std::to_string(device) + " raised a non-standard exception");
  }
}

int intra_op_threads_for(const LaunchOptions& opts, int local_devices) {
  if (opts.intra_op_threads > 0) return opts.intra_op_threads;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores <= 0) cores = 1;
  return std::max(1, cores / std::max(1, local_devices));
}

void set_intra_op_threads(int n) { omp_set_num_threads(std::max(1, n)); }

}  // namespace distjax::comm::detail
