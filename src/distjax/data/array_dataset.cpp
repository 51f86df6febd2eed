#include "distjax/data/array_dataset.hpp"

#include <algorithm>

#include "distjax/core/error.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::data {

Tensor gather_rows(const Tensor& x, const std::vector<std::int64_t>& indices) {
  DISTJAX_CHECK(x.defined() && x.rank() >= 1, InvalidArgument,
                "[gather_rows] expected a tensor with a row dimension");
  const std::int64_t n = x.size(0);
  Shape shape = x.shape();
  shape[0] = static_cast<std::int64_t>(indices.size());
  for (const std::int64_t r : indices)
    DISTJAX_CHECK(0 <= r && r < n, InvalidArgument, "[gather_rows] index ", r, " out of range for ",
                  n, " rows");
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const Tensor rows = Tensor::from_vector(indices, {static_cast<std::int64_t>(indices.size())},
                                          x.device());
  const std::size_t row_bytes = n == 0 ? 0 : x.nbytes() / static_cast<std::size_t>(n);
  tensor::detail::Dispatch k("gather_rows", &tensor::detail::KernelTable::data, {&x, &rows, &out});
  k->gather_rows(x.raw_data(), row_bytes, rows.data<std::int64_t>(), rows.numel(), out.raw_data(),
                 k.stream());
  return out;
}

std::int64_t ArrayDataset::size() const {
  return train::Batch{inputs, labels}.size();
}

train::Batch ArrayDataset::slice(std::int64_t begin, std::int64_t end) const {
  return train::Batch{inputs, labels}.slice(begin, end);
}

train::Batch ArrayDataset::gather(const std::vector<std::int64_t>& indices) const {
  size();  // validates
  return train::Batch{gather_rows(inputs, indices),
                      labels.defined() ? gather_rows(labels, indices) : Tensor()};
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
