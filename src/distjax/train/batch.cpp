#include "distjax/train/batch.hpp"

#include <utility>

#include "distjax/core/error.hpp"

namespace distjax::train {

std::int64_t Batch::size() const {
  DISTJAX_CHECK(inputs.defined() && inputs.rank() >= 1, InvalidArgument,
                "[Batch] inputs must be a defined tensor with a batch dimension");
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"labels", &labels},
                                {"documents", &documents}})
    DISTJAX_CHECK(!t->defined() || (t->rank() >= 1 && t->size(0) == inputs.size(0)),
                  InvalidArgument, "[Batch] inputs ", to_string(inputs.shape()), " and ", name,
                  " ", to_string(t->shape()), " disagree on the batch dimension");
  return inputs.size(0);
}

Batch Batch::slice(std::int64_t begin, std::int64_t end) const {
  const std::int64_t n = size();
  DISTJAX_CHECK(0 <= begin && begin <= end && end <= n, InvalidArgument, "[Batch::slice] [", begin,
                ", ", end, ") is outside a batch of ", n);
  return map([&](const Tensor& t) { return t.view_rows(begin, end); });
}

}  // namespace distjax::train
