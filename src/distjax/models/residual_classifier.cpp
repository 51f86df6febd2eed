#include "distjax/models/residual_classifier.hpp"

#include "distjax/nn/dense.hpp"
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
using parallel::TPLayout;
using parallel::TPMode;

ResidualClassifier::ResidualClassifier(ResidualClassifierConfig config)
    : config_(std::move(config)) {
  const auto& c = config_;
  DISTJAX_CHECK(c.in_features > 0 && c.hidden > 0 && c.num_classes > 0 && c.num_layers >= 0 &&
                    c.mlp_expansion > 0,
                ConfigError,
                "[ResidualClassifier] in_features, hidden, num_classes, mlp_expansion must be > 0 "
                "and num_layers >= 0, got ",
                c.in_features, ", ", c.hidden, ", ", c.num_classes, ", ", c.mlp_expansion, ", ",
                c.num_layers);
  DISTJAX_CHECK(c.dropout >= 0.f && c.dropout < 1.f, ConfigError,
                "[ResidualClassifier] dropout must be in [0, 1), got ", c.dropout);
  DISTJAX_CHECK(c.tp.layout == TPLayout::None || c.tp.layout == TPLayout::Gather ||
                    c.tp.layout == TPLayout::Async,
                ConfigError, "[ResidualClassifier] tensor parallel layout \"",
                parallel::tp_layout_name(c.tp.layout),
                "\": the classifier's layouts are none, gather and async");
  DISTJAX_CHECK(!c.tp.sequence_parallel && !c.tp.vocab_parallel, ConfigError,
                "[ResidualClassifier] has no sequence or vocabulary parallelism (a Transformer's)");
}

// h + fc2(dropout(silu(fc1(rms_norm(h))))), h whole (none) or feature-sharded.
Tensor ResidualClassifier::block(const nn::Scope& scope, const Tensor& h) const {
  const auto& c = config_;
  const nn::Initializer kinit = nn::scaled(nn::lecun_normal(), c.kernel_init_adjustment);
  const std::int64_t wide = c.hidden * c.mlp_expansion;
  const std::string& axis = c.tp.axis;
  Tensor y;
  switch (c.tp.layout) {
    case TPLayout::None:
      y = nn::RMSNorm{}(scope.child("norm"), h);
      y = nn::Dense{.features = wide, .kernel_init = kinit}(scope.child("fc1"), y);
      y = nn::Dropout{.rate = c.dropout}(scope.child("dropout"), tensor::silu(y));
      return tensor::add(
          h, nn::Dense{.features = c.hidden, .kernel_init = kinit}(scope.child("fc2"), y));
    case TPLayout::Gather: {
      spmd::DeviceContext* ctx = scope.context();
      const bool split = scope.axis_size(mesh::Axes(axis)) > 1;
      const Tensor full =
          split ? spmd::all_gather(*ctx, h, mesh::Axes(axis), 1, /*tiled=*/true) : h;
      y = nn::RMSNorm{}(scope.child("norm"), full);
      y = TPDense{.features = wide,
                  .axis = axis,
                  .mode = TPMode::Gather,
                  .skip_communication = true,
                  .kernel_init = kinit}(scope.child("fc1"), y);
      y = nn::Dropout{.rate = c.dropout, .spec = mesh::P(std::nullopt, axis)}(
          scope.child("dropout"), tensor::silu(y));
      return tensor::add(h, TPDense{.features = c.hidden,
                                    .axis = axis,
                                    .mode = TPMode::Scatter,
                                    .kernel_init = kinit}(scope.child("fc2"), y));
    }
    case TPLayout::Async:
    case TPLayout::Megatron:
      break;
  }
  // Async: the norm on the sharded features, the gather ring inside fc1's matmul, the
  // reduce-scatter ring inside fc2's.
  y = parallel::TPNorm{.kind = parallel::TPNorm::Kind::RMS, .axis = axis}(scope.child("norm"), h);
  y = parallel::TPAsyncDense{.features = wide,
                             .axis = axis,
                             .mode = TPMode::Gather,
                             .bidirectional = c.tp.bidirectional,
                             .kernel_init = kinit}(scope.child("fc1"), y);
  y = nn::Dropout{.rate = c.dropout, .spec = mesh::P(std::nullopt, axis)}(scope.child("dropout"),
                                                                          tensor::silu(y));
  return tensor::add(h, parallel::TPAsyncDense{.features = c.hidden,
                                               .axis = axis,
                                               .mode = TPMode::Scatter,
                                               .bidirectional = c.tp.bidirectional,
                                               .kernel_init = kinit}(scope.child("fc2"), y));
}

Tensor ResidualClassifier::operator()(const nn::Scope& scope, const Tensor& x) const {
  const auto& c = config_;
  tensor::check_defined(x, "ResidualClassifier", "x");
  DISTJAX_CHECK(x.rank() == 2 && x.size(1) == c.in_features, InvalidArgument,
                "[ResidualClassifier] expected x (B, ", c.in_features, "), got ",
                to_string(x.shape()));
  const nn::Scope layers = scope.child("layers");
  if (c.tp.layout == TPLayout::None) {
    Tensor h = nn::Dense{.features = c.hidden}(scope.child("input"), x);  // (B, D)
    for (int i = 0; i < c.num_layers; ++i)
      h = block(layers.child(i), h);
    return nn::Dense{.features = c.num_classes}(scope.child("output"), h);
  }
  const mesh::Axes axis(c.tp.axis);
  const int n = scope.axis_size(axis);
  DISTJAX_CHECK(c.hidden % n == 0, ShardingError, "[ResidualClassifier] hidden=", c.hidden,
                " is not divisible by ", c.tp.axis, "=", n);
  // x is whole on every device: the input layer needs no gather.
  Tensor h = TPDense{.features = c.hidden,
                     .axis = c.tp.axis,
                     .mode = TPMode::Gather,
                     .skip_communication = true}(scope.child("input"), x);  // (B, D/n)
  for (int i = 0; i < c.num_layers; ++i)
    h = block(layers.child(i), h);
  // Partial logits from this device's hidden block, summed over the axis; one bias.
  Tensor partial = TPDense{.features = c.num_classes,
                           .axis = c.tp.axis,
                           .mode = TPMode::Scatter,
                           .skip_communication = true,
                           .use_bias = false}(scope.child("output"), h);
  Tensor logits = parallel::reduce_from_tp_region(scope.context(), partial, axis);
  return tensor::add(logits, scope.child("output").param("bias", {c.num_classes}, nn::zeros()));
}

TensorTree ResidualClassifier::init(Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                                    const nn::FullySharded* fsdp) const {
  return nn::init_parameters(key, specs, ctx, fsdp, [&](const nn::Scope& scope) {
    (*this)(scope, Tensor::zeros({1, config_.in_features}));
  });
}

std::int64_t ResidualClassifier::num_params() const {
  const auto& c = config_;
  const std::int64_t e = c.hidden * c.mlp_expansion;
  const std::int64_t block = c.hidden + c.hidden * e + e + e * c.hidden + c.hidden;
  return c.in_features * c.hidden + c.hidden + c.num_layers * block + c.hidden * c.num_classes +
         c.num_classes;
}

}  // namespace distjax::models
