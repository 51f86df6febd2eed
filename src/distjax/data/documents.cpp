#include "distjax/data/documents.hpp"

#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/tensor/elementwise.hpp"

namespace distjax::data {

using tensor::Tensor;

train::Batch pack_documents(const train::Batch& b, std::int64_t eot) {
  const auto is_ids = [](const Tensor& t) {
    return t.defined() && t.rank() == 2 && (t.dtype() == DType::I32 || t.dtype() == DType::I64);
  };
  DISTJAX_CHECK(is_ids(b.inputs) && is_ids(b.labels) && b.labels.shape() == b.inputs.shape(),
                InvalidArgument, "[pack_documents] expected token windows: inputs and labels (B, "
                "T) of i32/i64, got ", b.inputs.str(0), " and ", b.labels.str(0));
  DISTJAX_CHECK(eot >= 0, InvalidArgument, "[pack_documents] eot = ", eot, " is not a token id");
  const auto host = [](const Tensor& t) {
    return tensor::astype(t, DType::I64).to(Device::cpu()).to_vector<std::int64_t>();
  };
  const std::vector<std::int64_t> tokens = host(b.inputs), targets = host(b.labels);
  std::vector<std::int32_t> ids(tokens.size());
  std::vector<std::int64_t> labels = targets;
  const auto len = static_cast<std::size_t>(b.inputs.size(1));
  for (std::size_t row = 0; row < tokens.size(); row += len) {
    std::int32_t seen = 0;
    for (std::size_t i = row; i < row + len; ++i) {
      ids[i] = seen;
      if (tokens[i] == eot) {
        ++seen;
        labels[i] = train::kIgnoreLabel;
      }
    }
  }
  const Device at = b.inputs.device();
  return {b.inputs,
          tensor::astype(Tensor::from_vector(labels, b.labels.shape(), at), b.labels.dtype()),
          Tensor::from_vector(ids, b.inputs.shape(), at)};
}

}  // namespace distjax::data
