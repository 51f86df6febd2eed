#include "distjax/data/array_dataset.hpp"

#include <algorithm>

#include "distjax/core/error.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::data {

std::int64_t ArrayDataset::size() const {
  return train::Batch{inputs, labels}.size();
}

train::Batch ArrayDataset::slice(std::int64_t begin, std::int64_t end) const {
  return train::Batch{inputs, labels}.slice(begin, end);
}

train::Batch ArrayDataset::gather(const std::vector<std::int64_t>& indices) const {
  size();  // validates
  return train::Batch{tensor::gather_rows(inputs, indices),
                      labels.defined() ? tensor::gather_rows(labels, indices) : Tensor()};
}

std::vector<train::Batch> ArrayDataset::batches(std::int64_t batch_size) const {
  DISTJAX_CHECK(batch_size >= 1, InvalidArgument,
                "[ArrayDataset::batches] batch_size must be >= 1, got ", batch_size);
  std::vector<train::Batch> out;
  const std::int64_t n = size();
  for (std::int64_t b = 0; b < n; b += batch_size)
    out.push_back(slice(b, std::min(n, b + batch_size)));
  return out;
}

}  // namespace distjax::data
