// Device memory for communication backends (see device_memory.hpp): each call finds the
// device's communication and copy kernels, names its op for the checked device's fault
// report and opens the checked blocks it is given while the kernel runs.
#include "distjax/tensor/device_memory.hpp"

#include <utility>

#include "distjax/core/error.hpp"
#include "distjax/tensor/detail/checked_memory.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::raw {

namespace {

using detail::KernelTable;

template <class F>
const F& kernels(const char* op, Device device, const F* KernelTable::*family) {
  const F* k = detail::kernel_table(device.kind).*family;
  if (!k) detail::no_kernel(op, device);
  detail::begin_op(op);
  return *k;
}

// Opens the checked blocks among `ps` for its lifetime. The CPU's kernels serve the CPU and
// the checked device, so a call may mix their blocks: each is opened where it is checked.
class Open {
 public:
  Open(Device device, std::initializer_list<const void*> ps)
      : host_(device.kind != DeviceKind::CUDA) {
    for (const void* p : ps)
      add(p);
  }
  void add(const void* p) {
    if (host_ && p && detail::checked::contains(p)) scope_.open(p);
  }

 private:
  bool host_;
  detail::OpenScope scope_;
};

detail::RankReduce rank_reduce(Reduction r) {
  switch (r) {
    case Reduction::Sum:
      return detail::RankReduce::Sum;
    case Reduction::Mean:
      return detail::RankReduce::Mean;
    case Reduction::Max:
      return detail::RankReduce::Max;
  }
  DISTJAX_THROW(InvalidArgument, "[reduce] unknown reduction ", static_cast<int>(r));
}

}  // namespace

void copy(const char* op, Device device, void* dst, const void* src, std::size_t nbytes) {
  if (nbytes == 0 || dst == src) return;
  const auto& k = kernels(op, device, &KernelTable::copy);
  Open open(device, {dst, src});
  k.copy_2d(src, nbytes, dst, nbytes, nbytes, 1);
}

void zero(const char* op, Device device, void* dst, std::size_t nbytes) {
  if (nbytes == 0) return;
  const auto& k = kernels(op, device, &KernelTable::memory);
  Open open(device, {dst});
  k.zero(dst, nbytes);
}

void reduce(const char* op, Device device, void* dst, const void* const* srcs, int k,
            std::int64_t n, DType dtype, Reduction reduction, int divisor) {
  void* const dsts[1] = {dst};
  reduce(op, device, dsts, 1, srcs, k, n, dtype, reduction, divisor);
}

void reduce(const char* op, Device device, void* const* dsts, int m, const void* const* srcs, int k,
            std::int64_t n, DType dtype, Reduction reduction, int divisor) {
  DISTJAX_CHECK(k >= 1 && k <= kMaxSources && m >= 1 && m <= kMaxSources, InvalidArgument, "[", op,
                "] reduces 1 to ", kMaxSources, " blocks into as many at once, got ", k, " into ",
                m);
  if (n == 0) return;
  const auto& kern = kernels(op, device, &KernelTable::memory);
  Open open(device, {});
  for (int j = 0; j < m; ++j)
    open.add(dsts[j]);
  for (int j = 0; j < k; ++j)
    open.add(srcs[j]);
  kern.reduce_ranks(dsts, m, srcs, k, n, dtype, rank_reduce(reduction), divisor);
}

void to_host(const char* op, Device device, const void* src, void* host_dst, std::size_t nbytes) {
  if (nbytes == 0) return;
  const auto& k = kernels(op, device, &KernelTable::copy);
  Open open(device, {src});
  detail::count_host_wait(device);
  k.to_host(src, host_dst, nbytes);
}

void from_host(const char* op, Device device, const void* host_src, void* dst, std::size_t nbytes) {
  if (nbytes == 0) return;
  const auto& k = kernels(op, device, &KernelTable::copy);
  Open open(device, {dst});
  k.from_host(host_src, dst, nbytes);
}

void to_host_async(const char* op, Device device, const void* src, void* host_dst,
                   std::size_t nbytes) {
  if (nbytes == 0) return;
  const auto& k = kernels(op, device, &KernelTable::memory);
  Open open(device, {src});
  k.to_host_async(src, host_dst, nbytes);
}

void synchronize(const char* op, Device device) {
  detail::count_host_wait(device);
  kernels(op, device, &KernelTable::memory).synchronize();
}

void convert(const char* op, Device device, const void* src, DType src_dtype, void* dst,
             DType dst_dtype, std::int64_t n, void* stream) {
  if (n == 0) return;
  const auto& k = kernels(op, device, &KernelTable::copy);
  Open open(device, {src, dst});
  k.convert(src, src_dtype, dst, dst_dtype, n, detail::Stream{stream});
}

// ---------------------------------------------------------------- Event

Event Event::record(const char* op, Device device) {
  Event e;
  e.device_ = device;
  e.op_ = op;
  e.handle_ = kernels(op, device, &KernelTable::memory).event_record();
  return e;
}

void Event::wait() {
  if (!handle_) return;
  void* h = std::exchange(handle_, nullptr);
  kernels(op_, device_, &KernelTable::memory).event_wait(h);
}

bool Event::done() const {
  return !handle_ || kernels(op_, device_, &KernelTable::memory).event_done(handle_);
}

void Event::stream_wait() const {
  if (handle_) kernels(op_, device_, &KernelTable::memory).event_stream_wait(handle_);
}

Event::~Event() {
  if (handle_) detail::kernel_table(device_.kind).memory->event_release(handle_);
}

Event::Event(Event&& o) noexcept
    : device_(o.device_), op_(o.op_), handle_(std::exchange(o.handle_, nullptr)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (handle_) detail::kernel_table(device_.kind).memory->event_release(handle_);
    device_ = o.device_;
    op_ = o.op_;
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}

// ---------------------------------------------------------------- HostBlock

HostBlock::HostBlock(const char* op, Device device, std::size_t nbytes)
    : device_(device), nbytes_(nbytes) {
  data_ = kernels(op, device, &KernelTable::memory).host_alloc(nbytes);
}

HostBlock::~HostBlock() {
  if (data_) detail::kernel_table(device_.kind).memory->host_free(data_, nbytes_);
}

HostBlock::HostBlock(HostBlock&& o) noexcept
    : device_(o.device_),
      data_(std::exchange(o.data_, nullptr)),
      nbytes_(std::exchange(o.nbytes_, 0)) {}

HostBlock& HostBlock::operator=(HostBlock&& o) noexcept {
  if (this != &o) {
    if (data_) detail::kernel_table(device_.kind).memory->host_free(data_, nbytes_);
    device_ = o.device_;
    data_ = std::exchange(o.data_, nullptr);
    nbytes_ = std::exchange(o.nbytes_, 0);
  }
  return *this;
}

}  // namespace distjax::tensor::raw
