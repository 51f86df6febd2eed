// The stream slot of every kernel: where a device orders its work (a CUDA stream); the
// CPU runs kernels at once and ignores it.
#pragma once

namespace distjax::tensor::detail {

struct Stream {
  void* handle = nullptr;
};

}  // namespace distjax::tensor::detail
