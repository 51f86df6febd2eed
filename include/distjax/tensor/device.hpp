// Where a tensor's storage lives. Kernels dispatch on Device::kind, so a CUDA backend
// can be added without touching callers.
#pragma once

#include <string>

namespace distjax::tensor {

enum class DeviceKind { CPU, CUDA };

/// A memory space and index: the CPU, or CUDA device `index`.
struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  static Device cpu() { return {}; }
  std::string str() const {
    return kind == DeviceKind::CPU ? "cpu" : "cuda:" + std::to_string(index);
  }
  friend bool operator==(const Device&, const Device&) = default;
};

}  // namespace distjax::tensor
