#include "distjax/tensor/tensor.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "distjax/tensor/detail/allocator.hpp"
#include "distjax/tensor/detail/cast.hpp"
#include "distjax/tensor/detail/dtype_visit.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {

namespace detail {
// Live and peak bytes of one thread's storages per device kind; shared with them, so a
// storage freed on another thread (or after its thread ended) still counts down the right
// counter.
struct ThreadMemory {
  static constexpr int kKinds = 3;  // DeviceKind's values
  std::atomic<std::int64_t> live[kKinds] = {};
  std::atomic<std::int64_t> peak[kKinds] = {};
};
}  // namespace detail

namespace {
const std::shared_ptr<detail::ThreadMemory>& thread_memory() {
  thread_local const std::shared_ptr<detail::ThreadMemory> m =
      std::make_shared<detail::ThreadMemory>();
  return m;
}
}  // namespace

std::int64_t live_bytes(DeviceKind kind) {
  return thread_memory()->live[static_cast<int>(kind)].load(std::memory_order_relaxed);
}
std::int64_t peak_bytes(DeviceKind kind) {
  return thread_memory()->peak[static_cast<int>(kind)].load(std::memory_order_relaxed);
}
void reset_peak_bytes(DeviceKind kind) {
  auto& m = *thread_memory();
  const int k = static_cast<int>(kind);
  m.peak[k].store(m.live[k].load(std::memory_order_relaxed), std::memory_order_relaxed);
}
namespace {
std::int64_t& host_wait_count(DeviceKind kind) {
  thread_local std::int64_t counts[detail::ThreadMemory::kKinds] = {};
  return counts[static_cast<int>(kind)];
}
}  // namespace

std::int64_t host_waits(DeviceKind kind) { return host_wait_count(kind); }
void detail::count_host_wait(Device device) {
  if (device.kind != DeviceKind::CPU) ++host_wait_count(device.kind);
}

// ---------------------------------------------------------------- deferred checks

namespace {
struct DeferredCheck {
  std::string op;
  std::string what;  // "id", "label"
  Tensor verdict;    // 2 i64 on the device: {flat index, value} of the first bad id, or -1
  std::int64_t v;
};
// The calling thread's (a simulated device's) checks not read yet, in op order.
std::vector<DeferredCheck>& deferred_checks() {
  thread_local std::vector<DeferredCheck> checks;
  return checks;
}
thread_local bool reading_checks = false;
// Checks queued before the host reads them all at once (a wait) to bound their memory.
constexpr std::size_t kMaxDeferredChecks = 1024;
}  // namespace

void detail::defer_id_check(const char* op, const char* what, Tensor verdict, std::int64_t v) {
  deferred_checks().push_back({op, what, std::move(verdict), v});
  if (deferred_checks().size() >= kMaxDeferredChecks) raise_deferred_errors();
}

void raise_deferred_errors() {
  if (reading_checks || deferred_checks().empty()) return;
  reading_checks = true;
  std::vector<DeferredCheck> checks;
  checks.swap(deferred_checks());
  try {
    // The verdicts of one device gathered there and read with one wait (a run's checks are
    // all its device's), the first bad one in op order reported.
    std::vector<std::int64_t> all;
    all.reserve(2 * checks.size());
    for (std::size_t i = 0; i < checks.size();) {
      std::size_t j = i;
      std::vector<Tensor> same;
      while (j < checks.size() && checks[j].verdict.device() == checks[i].verdict.device())
        same.push_back(checks[j++].verdict);
      const std::vector<std::int64_t> b =
          (same.size() == 1 ? same[0] : concat(same, 0)).to_vector<std::int64_t>();
      all.insert(all.end(), b.begin(), b.end());
      i = j;
    }
    for (std::size_t i = 0; i < checks.size(); ++i) {
      const DeferredCheck& c = checks[i];
      const std::int64_t at = all[2 * i], value = all[2 * i + 1];
      DISTJAX_CHECK(at < 0, InvalidArgument, "[", c.op, "] ", c.what, " ", value,
                    " at flat index ", at, " is outside [0, ", c.v, ") (found on ",
                    c.verdict.device().str(), " when the op ran; reported at the next read)");
    }
  } catch (...) {
    reading_checks = false;
    throw;
  }
  reading_checks = false;
}

std::int64_t live_bytes() { return live_bytes(current_device().kind); }
std::int64_t peak_bytes() { return peak_bytes(current_device().kind); }
void reset_peak_bytes() { reset_peak_bytes(current_device().kind); }

Storage::Storage(std::size_t nbytes, Device device)
    : nbytes_(nbytes),
      device_(device),
      allocator_(&detail::allocator_for(device, "Storage")),
      owner_(thread_memory()) {
  data_ = allocator_->alloc(nbytes, device.index);
  DISTJAX_CHECK(data_ != nullptr || nbytes == 0, Error, "[Storage] out of memory allocating ", nbytes,
                " bytes on ", device.str());
  const int k = static_cast<int>(device.kind);
  const auto n = static_cast<std::int64_t>(nbytes);
  const std::int64_t live = owner_->live[k].fetch_add(n, std::memory_order_relaxed) + n;
  // Only the owning thread raises its peak, so a plain max suffices.
  if (live > owner_->peak[k].load(std::memory_order_relaxed))
    owner_->peak[k].store(live, std::memory_order_relaxed);
}

Storage::Storage(void* data, std::size_t nbytes, Device device, std::function<void()> release)
    : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (allocator_ == nullptr) {
    if (release_) release_();
    return;
  }
  allocator_->free(data_, nbytes_, device_.index);
  owner_->live[static_cast<int>(device_.kind)].fetch_sub(static_cast<std::int64_t>(nbytes_),
                                                         std::memory_order_relaxed);
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device,
                         std::function<void()> release) {
  for (auto d : shape)
    DISTJAX_CHECK(d >= 0, InvalidArgument, "[Tensor::from_blob] negative dimension in ",
                  to_string(shape));
  DISTJAX_CHECK(dtype != DType::F64, InvalidArgument,
                "[Tensor::from_blob] expected a tensor dtype (f32, bf16, f16, i32, i64), got f64");
  DISTJAX_CHECK(data != nullptr || distjax::numel(shape) == 0, InvalidArgument,
                "[Tensor::from_blob] null data for shape ", to_string(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, t.nbytes(), device, std::move(release));
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape)
    DISTJAX_CHECK(d >= 0, InvalidArgument, "[Tensor::empty] negative dimension in ",
                  to_string(shape));
  DISTJAX_CHECK(dtype != DType::F64, InvalidArgument,
                "[Tensor::empty] expected a tensor dtype (f32, bf16, f16, i32, i64), got f64 "
                "(a comm dtype only)");
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  detail::fill(t, value);
  return t;
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}

Tensor Tensor::arange(std::int64_t n, DType dtype, Device device) {
  std::vector<float> values(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  for (std::int64_t i = 0; i < n; ++i)
    values[static_cast<std::size_t>(i)] = static_cast<float>(i);
  Tensor t = from_vector(values, {n}, device);
  if (dtype == DType::F32) return t;
  Tensor out = empty({n}, dtype, device);
  detail::convert(t, out);
  return out;
}

std::int64_t Tensor::size(int axis) const {
  return shape_[normalize_axis(axis, rank(), "Tensor::size")];
}

Device Tensor::device() const {
  return storage_ ? storage_->device() : Device::cpu();
}

void* Tensor::raw_data() const {
  DISTJAX_CHECK(defined(), InvalidArgument, "[Tensor::raw_data] tensor is undefined");
  return static_cast<char*>(storage_->data()) + offset_;
}

template <class T>
T Tensor::item() const {
  DISTJAX_CHECK(numel() == 1, InvalidArgument, "[Tensor::item] expected one element, shape is ",
                to_string(shape_));
  const Tensor host = to(Device::cpu());
  return static_cast<T>(detail::load_as_double(host.raw_data(), dtype_, 0));
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template std::int32_t Tensor::item<std::int32_t>() const;
template std::int64_t Tensor::item<std::int64_t>() const;

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  detail::Dispatch k("clone", &detail::KernelTable::copy, {this, &t});
  k->copy_2d(raw_data(), nbytes(), t.raw_data(), nbytes(), nbytes(), 1);
  t.vma_ = vma_;
  return t;
}

Tensor Tensor::to(Device device) const {
  check_defined(*this, "Tensor::to", "the tensor");
  const Device from = this->device();
  if (from == device) return *this;
  if (from.kind != DeviceKind::CPU && device.kind != DeviceKind::CPU)
    return to(Device::cpu()).to(device);  // between two devices: through the host
  Tensor t = empty(shape_, dtype_, device);
  if (device.kind == DeviceKind::CPU) {
    detail::count_host_wait(from);
    {
      detail::Dispatch k("Tensor::to", &detail::KernelTable::copy, {this});
      k->to_host(raw_data(), t.raw_data(), nbytes());
    }
    raise_deferred_errors();  // the device's queued work is done: its verdicts cost no wait
  } else {
    detail::Dispatch k("Tensor::to", &detail::KernelTable::copy, {&t});
    k->from_host(raw_data(), t.raw_data(), nbytes());
  }
  t.vma_ = vma_;
  return t;
}

Tensor Tensor::detach() const {
  Tensor t = *this;
  t.node_.reset();
  t.out_index_ = 0;
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  DISTJAX_CHECK(distjax::numel(shape) == numel(), InvalidArgument, "[Tensor::view] cannot view ",
                to_string(shape_), " as ", to_string(shape));
  Tensor t = detach();
  t.shape_ = shape;
  return t;
}

Tensor Tensor::view_rows(std::int64_t begin, std::int64_t end) const {
  DISTJAX_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], InvalidArgument,
                "[Tensor::view_rows] rows [", begin, ", ", end, ") of shape ", to_string(shape_));
  Tensor t = detach();
  std::size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / shape_[0];
  t.offset_ += static_cast<std::size_t>(begin) * row_bytes;
  t.shape_[0] = end - begin;
  return t;
}

void Tensor::set_grad_node(std::shared_ptr<Node> node, int output_index) {
  node_ = std::move(node);
  out_index_ = output_index;
}

std::string Tensor::str(int max_values) const {
  std::ostringstream os;
  if (!defined()) return "Tensor(undefined)";
  os << "Tensor(" << dtype_name(dtype_) << ", " << to_string(shape_);
  std::int64_t n = std::min<std::int64_t>(numel(), max_values);
  if (device().kind != DeviceKind::CPU) os << ", " << device().str();
  if (n > 0) {
    const Tensor host = to(Device::cpu());
    os << ", [";
    for (std::int64_t i = 0; i < n; ++i)
      os << (i ? ", " : "") << detail::load_as_double(host.raw_data(), dtype_, i);
    if (numel() > n) os << ", ...";
    os << "]";
  }
  os << ")";
  return os.str();
}

void check_dtype(const Tensor& t, DType want, const char* op, const char* what) {
  check_defined(t, op, what);
  DISTJAX_CHECK(t.dtype() == want, InvalidArgument, "[", op, "] expected dtype ", dtype_name(want),
                " for ", what, ", got ", dtype_name(t.dtype()));
}

void check_defined(const Tensor& t, const char* op, const char* what) {
  DISTJAX_CHECK(t.defined(), InvalidArgument, "[", op, "] ", what, " is an undefined tensor");
}

}  // namespace distjax::tensor
