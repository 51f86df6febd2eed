#include "distjax/comm/buffer.hpp"

#include "distjax/tensor/tensor.hpp"

namespace distjax::comm {

Buffer buffer_of(const tensor::Tensor& t) {
  tensor::check_defined(t, "buffer_of", "the tensor");
  return {t.raw_data(), t.numel(), t.dtype(), t.device()};
}

}  // namespace distjax::comm
