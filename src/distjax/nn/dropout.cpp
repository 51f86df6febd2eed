#include "distjax/nn/dropout.hpp"

#include "distjax/mesh/named_sharding.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::nn {

Tensor Dropout::operator()(const Scope& scope, const Tensor& x) const {
  DISTJAX_CHECK(rate >= 0.f && rate < 1.f, InvalidArgument, "[Dropout] \"", scope.path(),
                "\" rate must be in [0, 1), got ", rate);
  if (!scope.train() || rate == 0.f) return x;
  if (sequence_starts.empty() && (scope.context() == nullptr || spec.size() == 0))
    return tensor::dropout(x, rate, scope.dropout_key());
  Shape global = x.shape();
  std::vector<std::int64_t> start(x.shape().size(), 0);
  if (scope.context() != nullptr && spec.size() > 0) {
    const mesh::NamedSharding sharding(scope.context()->mesh(), spec);
    global = sharding.global_shape(x.shape());
    start.clear();
    for (const auto& [begin, end] : sharding.shard_range(global, scope.context()->device()))
      start.push_back(begin);
  }
  if (sequence_starts.empty()) return tensor::dropout(x, rate, scope.dropout_key(), global, start);
  // Chunks of a longer sequence: each its block of the whole sequence's mask.
  const auto k = static_cast<std::int64_t>(sequence_starts.size());
  DISTJAX_CHECK(x.rank() >= 2 && x.size(1) % k == 0 && global[1] == x.size(1) &&
                    sequence_length > 0,
                InvalidArgument, "[Dropout] \"", scope.path(), "\": ", k,
                " sequence chunks of a sequence of ", sequence_length, " need x (B, T, ...) with T ",
                "a multiple of ", k, " and not split by the spec, got ", to_string(x.shape()));
  global[1] = sequence_length;
  const std::int64_t c = x.size(1) / k;
  std::vector<Tensor> parts;
  for (std::int64_t i = 0; i < k; ++i) {
    start[1] = sequence_starts[static_cast<std::size_t>(i)];
    parts.push_back(tensor::dropout(tensor::slice(x, 1, i * c, (i + 1) * c), rate,
                                    scope.dropout_key(), global, start));
  }
  return parts.size() == 1 ? parts[0] : tensor::concat(parts, 1);
}

}  // namespace distjax::nn
