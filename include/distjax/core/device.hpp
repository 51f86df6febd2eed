// Device: where memory lives, one type for tensors (tensor::Storage) and communication
// (comm::Buffer): the CPU, or CUDA device `index`. Kernels and backends check the kind and
// refuse one they cannot reach, naming the op and the device.
#pragma once

#include <string>

namespace distjax {

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

}  // namespace distjax
