#include "distjax/models/pp_classifier.hpp"

#include "distjax/models/classifier.hpp"
#include "distjax/nn/dense.hpp"
#include "distjax/nn/dropout.hpp"
#include "distjax/nn/layer_norm.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"

namespace distjax::models {

PPClassifier::PPClassifier(PPClassifierConfig config) : config_(std::move(config)) {
  const auto& c = config_;
  DISTJAX_CHECK(c.in_features > 0 && c.hidden > 0 && c.num_layers >= 1 && c.mlp_expansion > 0 &&
                    c.num_classes > 0,
                ConfigError,
                "[PPClassifier] in_features, hidden, num_layers, mlp_expansion and "
                "num_classes must be >= 1");
  DISTJAX_CHECK(c.dropout >= 0.f && c.dropout < 1.f, ConfigError,
                "[PPClassifier] dropout must be in [0, 1), got ", c.dropout);
}

Tensor PPClassifier::run_chunk(const nn::Scope& scope, int chunk, int num_chunks,
                               const Tensor& x_in, const Tensor& inputs) const {
  const auto& c = config_;
  const auto [first, last] = parallel::partition_layers(static_cast<int>(c.num_layers), num_chunks,
                                                        c.layers_per_chunk)[chunk];
  Tensor x = x_in;
  if (chunk == 0) {
    DISTJAX_CHECK(inputs.rank() == 2 && inputs.size(1) == c.in_features, InvalidArgument,
                  "[PPClassifier] expected x (B, ", c.in_features, "), got ",
                  to_string(inputs.shape()));
    x = nn::Dense{.features = c.hidden}(scope.child("input"), inputs);
  }
  const nn::Scope blocks = scope.child("blocks");
  for (int i = first; i < last; ++i) {
    const nn::Scope b = blocks.child(i);
    Tensor h = nn::LayerNorm{}(b.child("norm"), x);
    h = tensor::silu(nn::Dense{.features = c.mlp_expansion * c.hidden}(b.child("fc1"), h));
    h = nn::Dropout{.rate = c.dropout}(b.child("dropout"), h);
    x = tensor::add(x, nn::Dense{.features = c.hidden}(b.child("fc2"), h));
  }
  if (chunk == num_chunks - 1) {
    x = nn::LayerNorm{}(scope.child("out_norm"), x);
    x = nn::Dense{.features = c.num_classes}(scope.child("head"), x);
  }
  return x;
}

Tensor PPClassifier::logits(const nn::Scope& scope, const Tensor& x) const {
  return run_chunk(scope, 0, 1, Tensor(), x);
}

std::pair<Tensor, train::Metrics> PPClassifier::loss(const Tensor& logits,
                                                     const Tensor& labels) const {
  return classification_loss(logits, labels);
}

train::LossFn PPClassifier::loss_fn() const {
  return [this](const TensorTree& params, const train::Batch& batch, Key key) {
    return loss(logits(nn::Scope::apply(&params, true, key), batch.inputs), batch.labels);
  };
}

Tensor PPClassifier::forward(const nn::Scope& scope, int chunk, int num_chunks, const Tensor& x,
                             const train::Batch& mb, train::Metrics& metrics) const {
  Tensor y = run_chunk(scope, chunk, num_chunks, x, mb.inputs);
  if (chunk < num_chunks - 1) return y;
  auto [l, m] = loss(y, mb.labels);
  metrics.merge(m);
  return l;
}

Shape PPClassifier::activation_shape(const nn::Scope&, int, int, const train::Batch& mb) const {
  return {mb.size(), config_.hidden};
}

TensorTree PPClassifier::init(Key key) const {
  return init(key, {0}, 1);
}

TensorTree PPClassifier::init(Key key, const std::vector<int>& chunks, int num_chunks,
                              nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                              const nn::FullySharded* fsdp) const {
  const Tensor inputs = Tensor::zeros({1, config_.in_features});
  return nn::init_parameters(key, specs, ctx, fsdp, [&](const nn::Scope& scope) {
    for (int c : chunks)
      run_chunk(scope, c, num_chunks, c == 0 ? Tensor() : Tensor::zeros({1, config_.hidden}),
                inputs);
  });
}

}  // namespace distjax::models
