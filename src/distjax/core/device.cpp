#include "distjax/core/device.hpp"

#include <cstdlib>
#include <optional>

#include "distjax/core/error.hpp"

namespace distjax {

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::CPU: return "cpu";
    case DeviceKind::CUDA: return "cuda";
    case DeviceKind::Checked: return "checked";
  }
  return "?";
}

std::string Device::str() const {
  if (kind == DeviceKind::CPU) return "cpu";
  return std::string(device_kind_name(kind)) + ":" + std::to_string(index);
}

Device parse_device(const std::string& text) {
  const auto colon = text.find(':');
  const std::string name = text.substr(0, colon);
  Device d;
  if (name == "cpu") {
    d.kind = DeviceKind::CPU;
  } else if (name == "cuda") {
    d.kind = DeviceKind::CUDA;
  } else if (name == "checked") {
    d.kind = DeviceKind::Checked;
  } else {
    DISTJAX_THROW(InvalidArgument, "[parse_device] unknown device '", text,
                  "' (expected cpu, cuda, cuda:N, checked or checked:N)");
  }
  if (colon != std::string::npos) {
    const std::string index = text.substr(colon + 1);
    char* end = nullptr;
    const long i = std::strtol(index.c_str(), &end, 10);
    DISTJAX_CHECK(!index.empty() && *end == '\0' && i >= 0 && d.kind != DeviceKind::CPU,
                  InvalidArgument, "[parse_device] bad device index in '", text, "'");
    d.index = static_cast<int>(i);
  }
  return d;
}

Device default_device() {
  static const Device d = [] {
    const char* env = std::getenv("DISTJAX_DEVICE");
    return env && *env ? parse_device(env) : Device::cpu();
  }();
  return d;
}

namespace {
std::optional<Device>& thread_device() {
  thread_local std::optional<Device> d;
  return d;
}
}  // namespace

Device current_device() {
  auto& d = thread_device();
  if (!d) d = default_device();
  return *d;
}

void set_current_device(Device device) { thread_device() = device; }

}  // namespace distjax
