#include "distjax/models/classifier.hpp"

#include "distjax/nn/dense.hpp"
#include "distjax/nn/dropout.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"

namespace distjax::models {

Classifier::Classifier(ClassifierConfig config) : config_(config) {
  DISTJAX_CHECK(config_.in_features > 0 && config_.hidden > 0 && config_.num_classes > 0,
                ConfigError, "[Classifier] in_features, hidden and num_classes must be > 0, got ",
                config_.in_features, ", ", config_.hidden, ", ", config_.num_classes);
  DISTJAX_CHECK(config_.dropout >= 0.f && config_.dropout < 1.f, ConfigError,
                "[Classifier] dropout must be in [0, 1), got ", config_.dropout);
}

Tensor Classifier::operator()(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "Classifier", "x");
  DISTJAX_CHECK(x.rank() == 2 && x.size(1) == config_.in_features, InvalidArgument,
                "[Classifier] expected x (B, ", config_.in_features, "), got ",
                to_string(x.shape()));
  Tensor h = nn::Dense{.features = config_.hidden}(scope.child("fc1"), x);
  h = tensor::silu(h);
  h = nn::Dropout{.rate = config_.dropout}(scope.child("dropout"), h);
  return nn::Dense{.features = config_.num_classes}(scope.child("fc2"), h);
}

TensorTree Classifier::init(Key key) const {
  return init(key, nullptr, nullptr);
}

TensorTree Classifier::init(Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                            const nn::FullySharded* fsdp) const {
  return nn::init_parameters(key, specs, ctx, fsdp, [&](const nn::Scope& scope) {
    (*this)(scope, Tensor::zeros({1, config_.in_features}));
  });
}

Tensor Classifier::apply(const TensorTree& params, const Tensor& x, bool train,
                         Key dropout_key) const {
  return (*this)(nn::Scope::apply(&params, train, dropout_key), x);
}

std::int64_t Classifier::num_params() const {
  const auto& c = config_;
  return c.in_features * c.hidden + c.hidden + c.hidden * c.num_classes + c.num_classes;
}

std::pair<Tensor, train::Metrics> classification_loss(const Tensor& logits, const Tensor& labels) {
  // Correct predictions counted on the logits' device, one number read when reported: with
  // d = prediction - label (small integers, exact in f32), relu(1 - d^2) is 1 where they
  // agree and 0 elsewhere, and a sum of ones is exact.
  const Tensor pred = tensor::argmax(logits.detach(), -1);
  const Tensor d = tensor::astype(pred, DType::F32) - tensor::astype(labels.detach(), DType::F32);
  const Tensor correct = tensor::sum(tensor::relu(tensor::add_scalar(-tensor::square(d), 1.0)));
  train::Metrics m;
  m.add("accuracy", correct, 1.0, static_cast<double>(pred.numel()));
  return {tensor::mean(tensor::cross_entropy(logits, labels)), m};
}

}  // namespace distjax::models
