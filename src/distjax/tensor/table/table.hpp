// The kernel table: one set of kernels per device kind, in families (one header each under
// table/), and the one dispatch point every op goes through.
//
//   Tensor out = Tensor::empty(shape, DType::F32, op_device("add", {&a, &b}));
//   Dispatch k("add", &KernelTable::elementwise, {&a, &b, &out});
//   k->binary(BinaryOp::Add, ...);
//
// Dispatch checks that every tensor it is given lives on one device (InvalidArgument naming
// the op and both devices otherwise), finds the device's kernels (NotImplemented naming the
// op and the device when this build has none), and on the checked device opens the
// tensors' memory for the kernel's duration: every tensor a kernel reads or writes must be
// in the list.
#pragma once

#include <atomic>
#include <initializer_list>
#include <vector>

#include "distjax/tensor/table/attention.hpp"
#include "distjax/tensor/table/copy.hpp"
#include "distjax/tensor/table/elementwise.hpp"
#include "distjax/tensor/table/gather.hpp"
#include "distjax/tensor/table/gemm.hpp"
#include "distjax/tensor/table/inplace.hpp"
#include "distjax/tensor/table/memory.hpp"
#include "distjax/tensor/table/moe.hpp"
#include "distjax/tensor/table/nn.hpp"
#include "distjax/tensor/table/reduce.hpp"
#include "distjax/tensor/table/shape.hpp"
#include "distjax/tensor/table/shard.hpp"
#include "distjax/tensor/table/update.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor::detail {

/// Every kernel family of one device kind; null where the kind has none.
struct KernelTable {
  const CopyKernels* copy = nullptr;
  const UpdateKernels* update = nullptr;
  const GatherKernels* gather = nullptr;
  const ElementwiseKernels* elementwise = nullptr;
  const ReduceKernels* reduce = nullptr;
  const ShapeKernels* shape = nullptr;
  const NnKernels* nn = nullptr;
  const AttentionKernels* attention = nullptr;
  const GemmKernels* gemm = nullptr;
  const InplaceKernels* inplace = nullptr;
  const ShardKernels* shard = nullptr;
  const MemoryKernels* memory = nullptr;
  const MoeKernels* moe = nullptr;
};

/// The table of a device kind: tensor/cpu/ for the CPU and the checked device.
const KernelTable& kernel_table(DeviceKind kind);

/// The device of an op's defined inputs, which must agree (InvalidArgument naming the op
/// and both devices); the current device when no input is defined.
Device op_device(const char* op, std::initializer_list<const Tensor*> inputs);
/// The same for a list made at run time (an op over many leaves).
Device op_device(const char* op, const std::vector<const Tensor*>& inputs);

/// Opens the checked device's memory of some tensors (or raw blocks) for host access while
/// it lives; nothing on other devices.
class OpenScope {
 public:
  OpenScope() = default;
  OpenScope(const OpenScope&) = delete;
  OpenScope& operator=(const OpenScope&) = delete;
  ~OpenScope();
  void open(const Tensor& t);
  void open(const void* p);

 private:
  std::vector<const void*> opened_;
};

/// Records `op` as the calling thread's current op (named by the checked device's fault
/// report).
void begin_op(const char* op);
/// Throws NotImplemented: `op` has no kernel for `device` in this build.
[[noreturn]] void no_kernel(const char* op, Device device);

/// Per-op device time on CUDA (profile_ops_begin / profile_ops_end in tensor/cuda.hpp):
/// while on, each CUDA dispatch records an event pair around its kernels.
extern std::atomic<bool> op_profiling;
void cuda_profile_begin(const char* op);  // tensor/cuda/ (a no-op in the stub)
void cuda_profile_end();

/// Where an op meets its kernels: see the file comment.
template <class F>
class Dispatch {
 public:
  Dispatch(const char* op, const F* KernelTable::*family,
           std::initializer_list<const Tensor*> touched)
      : device_(op_device(op, touched)) {
    start(op, family, touched);
  }
  /// The same for a list made at run time (an op over many leaves).
  Dispatch(const char* op, const F* KernelTable::*family, const std::vector<const Tensor*>& touched)
      : device_(op_device(op, touched)) {
    start(op, family, touched);
  }
  ~Dispatch() {
    if (profiled_) cuda_profile_end();
  }
  Dispatch(const Dispatch&) = delete;
  Dispatch& operator=(const Dispatch&) = delete;
  const F* operator->() const { return kernels_; }
  Device device() const { return device_; }

 private:
  template <class List>
  void start(const char* op, const F* KernelTable::*family, const List& touched) {
    kernels_ = kernel_table(device_.kind).*family;
    if (!kernels_) no_kernel(op, device_);
    begin_op(op);
    if (device_.kind == DeviceKind::Checked)
      for (const Tensor* t : touched)
        if (t->defined()) open_.open(*t);
    if (device_.kind == DeviceKind::CUDA && op_profiling.load(std::memory_order_relaxed)) {
      cuda_profile_begin(op);
      profiled_ = true;
    }
  }

  Device device_;
  const F* kernels_ = nullptr;
  OpenScope open_;
  bool profiled_ = false;
};

}  // namespace distjax::tensor::detail
