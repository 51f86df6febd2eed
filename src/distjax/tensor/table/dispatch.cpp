#include "distjax/core/error.hpp"
#include "distjax/tensor/detail/checked_memory.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::detail {

const KernelTable& cpu_kernel_table();   // tensor/cpu/table.cpp
const KernelTable& cuda_kernel_table();  // tensor/cuda/table.cpp (tensor/cuda_stub/: empty)
const KernelTable* counted_cpu_kernel_table();  // table/coverage.cpp: null unless asked for

std::atomic<bool> op_profiling{false};

const KernelTable& kernel_table(DeviceKind kind) {
  static const KernelTable none{};
  switch (kind) {
    case DeviceKind::CPU:
    case DeviceKind::Checked: {
      static const KernelTable* counted = counted_cpu_kernel_table();
      return counted != nullptr ? *counted : cpu_kernel_table();
    }
    case DeviceKind::CUDA: return cuda_kernel_table();
  }
  return none;
}

namespace {

template <class List>
Device common_device(const char* op, const List& inputs) {
  const Tensor* first = nullptr;
  for (const Tensor* t : inputs) {
    if (!t->defined()) continue;
    if (!first) {
      first = t;
    } else {
      DISTJAX_CHECK(t->device() == first->device(), InvalidArgument, "[", op,
                    "] expects its tensors on one device, got ", first->device().str(), " and ",
                    t->device().str(), " (move one with Tensor::to)");
    }
  }
  return first ? first->device() : current_device();
}

}  // namespace

Device op_device(const char* op, std::initializer_list<const Tensor*> inputs) {
  return common_device(op, inputs);
}

Device op_device(const char* op, const std::vector<const Tensor*>& inputs) {
  return common_device(op, inputs);
}

OpenScope::~OpenScope() {
  for (auto it = opened_.rbegin(); it != opened_.rend(); ++it) checked::close(*it);
}

void OpenScope::open(const Tensor& t) {
  if (t.device().kind == DeviceKind::Checked && t.nbytes() > 0) open(t.raw_data());
}

void OpenScope::open(const void* p) {
  checked::open(p);
  opened_.push_back(p);
}

void begin_op(const char* op) { checked::set_last_op(op); }

void no_kernel(const char* op, Device device) {
  DISTJAX_THROW(NotImplemented, "[", op, "] has no kernel for device ", device.str(),
                " in this build");
}

}  // namespace distjax::tensor::detail
