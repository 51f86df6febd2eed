// Tensor: an n-dimensional array value (shape, dtype, device) over shared storage,
// with the hook the autodiff tape records into.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distjax/core/dtype.hpp"
#include "distjax/core/error.hpp"
#include "distjax/core/shape.hpp"
#include "distjax/core/device.hpp"

namespace distjax::tensor {

using distjax::Device;  // core/device.hpp: one type for tensors and communication
using distjax::DeviceKind;

struct Node;

namespace detail {
struct ThreadMemory;
}

/// Bytes of tensor storage on devices of `kind` the calling thread has allocated and not
/// freed yet (wherever they are freed: a simulated device is a thread), and the most since
/// reset_peak_bytes(kind). Without a kind: the kind of the current device.
std::int64_t live_bytes(DeviceKind kind);
std::int64_t peak_bytes(DeviceKind kind);
/// Starts a new peak at the current live bytes.
void reset_peak_bytes(DeviceKind kind);
std::int64_t live_bytes();
std::int64_t peak_bytes();
void reset_peak_bytes();

/// How many times the calling thread has waited, through the tensor layer, for a device of
/// `kind` to finish its queued work: reads of device memory (Tensor::to the CPU, item,
/// to_vector, raw::to_host), sums of squares read back (sums_of_squares and its kin), and
/// raw::synchronize. Always 0 for the CPU, whose kernels run at once. A test counts them to
/// see a training step run without one.
std::int64_t host_waits(DeviceKind kind);
namespace detail {
/// Counts one host wait for `device` (not for the CPU).
void count_host_wait(Device device);
}  // namespace detail

/// Reads the verdicts of the checks that ran on a device since the last read, and throws
/// the first failure. The checks of values an op can only see where they are (ids inside
/// a table: embedding, cross_entropy) throw at once on the CPU; on another device the op
/// queues its verdict there and goes on without a host wait (its kernels stay inside their
/// buffers, writing NaN where an id is bad), and the calling thread's next read of device
/// memory (Tensor::to the CPU, item, to_vector; so any metric or log) throws it.
void raise_deferred_errors();

namespace detail {
struct DeviceAllocator;
}

/// Raw memory of one or more tensors on one device: 64-byte aligned, allocated by the
/// allocator of the device's kind and freed by the same one when the last user goes.
class Storage {
 public:
  Storage(std::size_t nbytes, Device device);
  /// Memory someone else owns (a NumPy array, a DLPack tensor): `release` runs when the
  /// last tensor over it goes. Not counted in live_bytes (DistJax did not allocate it), and
  /// aligned as its owner made it.
  Storage(void* data, std::size_t nbytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  Device device_;
  const detail::DeviceAllocator* allocator_ = nullptr;  // null for borrowed memory
  std::shared_ptr<detail::ThreadMemory> owner_;  // the allocating thread's counters
  std::function<void()> release_;                // borrowed memory: gives it back
};

/// A dense, row-major (contiguous) n-d array. Copies share storage (like a
/// shared_ptr); ops return new tensors. `clone()` copies the data.
///
/// A tensor that takes part in differentiation carries a grad node: the op that
/// produced it (or a leaf marker) on the current thread's tape. Ops record themselves
/// when grad mode is on and an input carries a node.
///
///   Tensor x = Tensor::from_vector({1.f, 2.f, 3.f, 4.f}, {2, 2});
///   Tensor y = matmul(x, x);           // (2, 2), f32
///   float v = sum(y).item<float>();
class Tensor {
 public:
  /// An undefined tensor (no storage); `defined()` is false.
  Tensor() = default;

  // Factories place their tensor on `device`: by default the calling thread's current
  // device (core/device.hpp), which a launch sets per simulated device.

  /// Uninitialised storage of the given shape and dtype (any but F64, which is comm only:
  /// InvalidArgument).
  static Tensor empty(const Shape& shape, DType dtype = DType::F32,
                      Device device = current_device());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32,
                      Device device = current_device());
  static Tensor ones(const Shape& shape, DType dtype = DType::F32,
                     Device device = current_device());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Device device = current_device());
  /// A rank-0 tensor.
  static Tensor scalar(double value, DType dtype = DType::F32, Device device = current_device());
  /// [0, 1, ..., n-1].
  static Tensor arange(std::int64_t n, DType dtype = DType::I64, Device device = current_device());
  /// Copies `values` (numel(shape) of them) into a new tensor of dtype_of<T>: filled on the
  /// host, then one copy to `device`.
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = current_device());
  /// A tensor over memory it does not own (no copy): `data` holds numel(shape) contiguous
  /// row-major elements of `dtype` on `device`, and stays valid until `release` runs, when
  /// the last tensor over it goes. What the Python module's NumPy and DLPack imports use.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device,
                          std::function<void()> release);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  /// Size of dimension `axis` (negative counts from the end).
  std::int64_t size(int axis) const;
  std::int64_t numel() const { return distjax::numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const;

  /// Typed pointer to the first element, in the memory of device(): the host may read it
  /// only for a CPU tensor (kernels take it on any device). Throws InvalidArgument if T is
  /// not the dtype.
  template <class T>
  T* data() const;
  void* raw_data() const;
  /// Copies to a host vector of T (dtype must match), from any device.
  template <class T>
  std::vector<T> to_vector() const;
  /// The single element of a tensor with numel() == 1, converted to T, from any device.
  template <class T>
  T item() const;

  /// This tensor on `device`: itself when it is there already, else a copy (through the
  /// host between two devices that are not the CPU), detached from the tape, keeping its
  /// varying axes.
  Tensor to(Device device) const;
  /// Deep copy on the same device, detached from the tape.
  Tensor clone() const;
  /// Same storage, no grad node: a constant to the tape.
  Tensor detach() const;
  /// Same storage viewed with another shape of equal numel (not recorded on the tape;
  /// use tensor::reshape for a differentiable reshape).
  Tensor view(const Shape& shape) const;
  /// Rows [begin, end) of dimension 0, sharing storage (not recorded on the tape).
  Tensor view_rows(std::int64_t begin, std::int64_t end) const;
  /// Whether the two tensors' bytes overlap in one storage.
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }
  /// Whether no other handle (tensor, view, copy) shares this one's storage: an op may then
  /// write its result over it (a backward over an input that only the tape kept).
  bool sole_owner() const { return storage_ != nullptr && storage_.use_count() == 1; }
  /// The storage this tensor views (null when undefined): what memory accounting counts
  /// once however many views share it.
  const Storage* storage() const { return storage_.get(); }

  /// Whether this tensor carries a grad node (is a leaf being differentiated or was
  /// computed from one).
  bool requires_grad() const { return node_ != nullptr; }
  const std::shared_ptr<Node>& grad_node() const { return node_; }
  int grad_output_index() const { return out_index_; }
  /// Used by the tape: attaches the node (and which of its outputs this tensor is).
  void set_grad_node(std::shared_ptr<Node> node, int output_index = 0);

  /// Inside shard_map: the mesh axes this value varies over, bit i for the mesh's axis i
  /// (JAX's `vma`); 0 = equal on every device (and always 0 outside shard_map). Ops give
  /// their result the union of their inputs' sets; the spmd collectives change it (see
  /// spmd/collectives.hpp). Copies, views, clones and detached tensors keep it.
  std::uint32_t varying_axes() const { return vma_; }
  /// Sets the varying-axes mask of this handle (not of other handles of the storage).
  /// Ops and the spmd layer call it; user code uses the spmd functions instead.
  void set_varying_axes(std::uint32_t mask) { vma_ = mask; }

  /// Short description: "Tensor(f32, (2, 3))" plus up to `max_values` values.
  std::string str(int max_values = 8) const;

 private:
  std::shared_ptr<Storage> storage_;
  std::size_t offset_ = 0;  // bytes from the start of storage_
  Shape shape_;
  DType dtype_ = DType::F32;
  std::shared_ptr<Node> node_;
  int out_index_ = 0;
  std::uint32_t vma_ = 0;  // varying mesh axes, see varying_axes()
};

/// Throws InvalidArgument "[op] expected dtype X for `what`, got Y" unless t.dtype()==want.
void check_dtype(const Tensor& t, DType want, const char* op, const char* what);
/// Throws InvalidArgument naming `op` unless `t` is defined.
void check_defined(const Tensor& t, const char* op, const char* what);

// ------------------------------------------------------------------ templates

template <class T>
T* Tensor::data() const {
  DISTJAX_CHECK(defined(), InvalidArgument, "[Tensor::data] tensor is undefined");
  DISTJAX_CHECK(dtype_of<T>() == dtype_, InvalidArgument, "[Tensor::data] requested ",
                dtype_name(dtype_of<T>()), " but the tensor holds ", dtype_name(dtype_));
  return reinterpret_cast<T*>(raw_data());
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  DISTJAX_CHECK(static_cast<std::int64_t>(values.size()) == distjax::numel(shape), InvalidArgument,
                "[Tensor::from_vector] ", values.size(), " values for shape ", to_string(shape));
  Tensor t = empty(shape, dtype_of<T>(), Device::cpu());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t.to(device);
}

namespace detail {
/// Queues a check that ran on a device for raise_deferred_errors: `verdict` holds 2 i64
/// there, {flat index, value} of the first `what` ("id", "label") outside [0, v) that `op`
/// was given, or {-1, 0}.
void defer_id_check(const char* op, const char* what, Tensor verdict, std::int64_t v);
}  // namespace detail

template <class T>
std::vector<T> Tensor::to_vector() const {
  const Tensor host = to(Device::cpu());
  const T* p = host.data<T>();
  return std::vector<T>(p, p + numel());
}

}  // namespace distjax::tensor
