#include "distjax/models/tp_classifier.hpp"

#include "distjax/nn/dropout.hpp"
#include "distjax/nn/rms_norm.hpp"
#include "distjax/parallel/tensor_parallel.hpp"
#include "distjax/parallel/tp_async_dense.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::models {

using parallel::TPDense;
using parallel::TPMode;

TPClassifier::TPClassifier(TPClassifierConfig config) : config_(std::move(config)) {
  const auto& c = config_;
  DISTJAX_CHECK(c.in_features > 0 && c.hidden > 0 && c.num_classes > 0 && c.num_layers >= 0 &&
                    c.mlp_expansion > 0,
                ConfigError,
                "[TPClassifier] in_features, hidden, num_classes, mlp_expansion must be > 0 and "
                "num_layers >= 0, got ",
                c.in_features, ", ", c.hidden, ", ", c.num_classes, ", ", c.mlp_expansion, ", ",
                c.num_layers);
  DISTJAX_CHECK(c.dropout >= 0.f && c.dropout < 1.f, ConfigError,
                "[TPClassifier] dropout must be in [0, 1), got ", c.dropout);
}

Tensor TPClassifier::operator()(const nn::Scope& scope, const Tensor& x) const {
  const auto& c = config_;
  tensor::check_defined(x, "TPClassifier", "x");
  DISTJAX_CHECK(x.rank() == 2 && x.size(1) == c.in_features, InvalidArgument,
                "[TPClassifier] expected x (B, ", c.in_features, "), got ", to_string(x.shape()));
  const mesh::Axes axis(c.axis);
  const int n = scope.axis_size(axis);
  DISTJAX_CHECK(c.hidden % n == 0, ShardingError, "[TPClassifier] hidden=", c.hidden,
                " is not divisible by ", c.axis, "=", n);
  spmd::DeviceContext* ctx = scope.context();

  // x is whole on every device: the input layer needs no gather.
  Tensor h = TPDense{.features = c.hidden,
                     .axis = c.axis,
                     .mode = TPMode::Gather,
                     .skip_communication = true}(scope.child("input"), x);  // (B, D/n)
  const nn::Scope layers = scope.child("layers");
  for (int i = 0; i < c.num_layers; ++i) {
    const nn::Scope block = layers.child(i);
    const nn::Initializer kinit = nn::scaled(nn::lecun_normal(), c.kernel_init_adjustment);
    Tensor y;
    if (c.async_rings) {
      // The norm on the sharded features, then the gather ring inside fc1's matmul.
      y = parallel::TPNorm{.kind = parallel::TPNorm::Kind::RMS, .axis = c.axis}(block.child("norm"),
                                                                                h);
      y = parallel::TPAsyncDense{.features = c.hidden * c.mlp_expansion,
                                 .axis = c.axis,
                                 .mode = TPMode::Gather,
                                 .bidirectional = c.bidirectional,
                                 .kernel_init = kinit}(block.child("fc1"), y);
    } else {
      Tensor full = n > 1 ? spmd::all_gather(*ctx, h, axis, 1, /*tiled=*/true) : h;  // (B, D)
      y = nn::RMSNorm{}(block.child("norm"), full);
      y = TPDense{.features = c.hidden * c.mlp_expansion,
                  .axis = c.axis,
                  .mode = TPMode::Gather,
                  .skip_communication = true,
                  .kernel_init = kinit}(block.child("fc1"), y);
    }
    y = nn::Dropout{.rate = c.dropout, .spec = mesh::P(std::nullopt, c.axis)}(
        block.child("dropout"), tensor::silu(y));
    if (c.async_rings) {
      y = parallel::TPAsyncDense{.features = c.hidden,
                                 .axis = c.axis,
                                 .mode = TPMode::Scatter,
                                 .bidirectional = c.bidirectional,
                                 .kernel_init = kinit}(block.child("fc2"), y);
    } else {
      y = TPDense{.features = c.hidden,
                  .axis = c.axis,
                  .mode = TPMode::Scatter,
                  .kernel_init = kinit}(block.child("fc2"), y);
    }
    h = tensor::add(h, y);  // (B, D/n)
  }
  // Partial logits from this device's hidden block, summed over the axis; one bias.
  Tensor partial = TPDense{.features = c.num_classes,
                           .axis = c.axis,
                           .mode = TPMode::Scatter,
                           .skip_communication = true,
                           .use_bias = false}(scope.child("output"), h);
  Tensor logits = parallel::reduce_from_tp_region(ctx, partial, axis);
  return tensor::add(logits, scope.child("output").param("bias", {c.num_classes}, nn::zeros()));
}

TensorTree TPClassifier::init(Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx) const {
  TensorTree params;
  tensor::NoGradGuard no_grad;
  nn::Scope scope = nn::Scope::init(&params, key, specs);
  if (ctx != nullptr) scope = scope.on(*ctx);
  (*this)(scope, Tensor::zeros({1, config_.in_features}));
  return params;
}

std::int64_t TPClassifier::num_params() const {
  const auto& c = config_;
  const std::int64_t e = c.hidden * c.mlp_expansion;
  const std::int64_t block = c.hidden + c.hidden * e + e + e * c.hidden + c.hidden;
  return c.in_features * c.hidden + c.hidden + c.num_layers * block + c.hidden * c.num_classes +
         c.num_classes;
}

}  // namespace distjax::models
