#include "distjax/train/batch.hpp"

#include "distjax/core/error.hpp"

namespace distjax::train {

std::int64_t Batch::size() const {
  DISTJAX_CHECK(inputs.defined() && inputs.rank() >= 1, InvalidArgument,
                "[Batch] inputs must be a defined tensor with a batch dimension");
  if (labels.defined()) {
    DISTJAX_CHECK(labels.rank() >= 1 && labels.size(0) == inputs.size(0), InvalidArgument,
                  "[Batch] inputs ", to_string(inputs.shape()), " and labels ",
                  to_string(labels.shape()), " disagree on the batch dimension");
  }
  return inputs.size(0);
}

Batch Batch::slice(std::int64_t begin, std::int64_t end) const {
  const std::int64_t n = size();
  DISTJAX_CHECK(0 <= begin && begin <= end && end <= n, InvalidArgument, "[Batch::slice] [", begin,
                ", ", end, ") is outside a batch of ", n);
  return Batch{inputs.view_rows(begin, end),
               labels.defined() ? labels.view_rows(begin, end) : Tensor()};
}

}  // namespace distjax::train
