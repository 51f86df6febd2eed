#include "distjax/nn/dropout.hpp"

#include "distjax/mesh/named_sharding.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/nn_ops.hpp"

namespace distjax::nn {

Tensor Dropout::operator()(const Scope& scope, const Tensor& x) const {
  DISTJAX_CHECK(rate >= 0.f && rate < 1.f, InvalidArgument, "[Dropout] \"", scope.path(),
                "\" rate must be in [0, 1), got ", rate);
  if (!scope.train() || rate == 0.f) return x;
  if (scope.context() == nullptr || spec.size() == 0)
    return tensor::dropout(x, rate, scope.dropout_key());
  const mesh::NamedSharding sharding(scope.context()->mesh(), spec);
  const Shape global = sharding.global_shape(x.shape());
  std::vector<std::int64_t> start;
  for (const auto& [begin, end] : sharding.shard_range(global, scope.context()->device()))
    start.push_back(begin);
  return tensor::dropout(x, rate, scope.dropout_key(), global, start);
}

}  // namespace distjax::nn
