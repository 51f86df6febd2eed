// Device: where memory lives, one type for tensors (tensor::Storage) and communication
// (comm::Buffer), and the calling thread's current device, where factories place new
// tensors. Kernels and backends check the kind and refuse one they cannot reach, naming
// the op and the device.
#pragma once

#include <string>

namespace distjax {

enum class DeviceKind {
  CPU,
  CUDA,
  /// The checked device: host memory the host cannot touch (kept PROT_NONE) except while
  /// one of the kernel table's kernels (the CPU ones) runs on it. Any other read or write
  /// of its tensors' data faults and is reported naming the last op of that thread, so
  /// a CPU machine proves that training touches tensor data only through the table.
  Checked,
};

/// "cpu", "cuda", "checked".
const char* device_kind_name(DeviceKind kind);

/// A memory space and index: the CPU, CUDA device `index`, or checked device `index`.
struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  static Device cpu() { return {}; }
  /// "cpu", "cuda:1", "checked:0".
  std::string str() const;
  friend bool operator==(const Device&, const Device&) = default;
};

/// Parses "cpu", "cuda", "cuda:N", "checked", "checked:N" (InvalidArgument otherwise).
Device parse_device(const std::string& text);

/// The calling thread's current device: the default placement of every tensor factory.
/// A thread starts on the process default: the CPU, or the environment's DISTJAX_DEVICE
/// ("checked" runs a whole program, tests included, on the checked device). A launch sets
/// each simulated device's thread to its own device.
Device current_device();
void set_current_device(Device device);
/// The process default described above (read once).
Device default_device();

/// Sets the current device for a scope and restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(Device device) : previous_(current_device()) { set_current_device(device); }
  ~DeviceScope() { set_current_device(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device previous_;
};

}  // namespace distjax
