#include "distjax/app/compose.hpp"

#include <algorithm>

#include "distjax/core/error.hpp"
#include "distjax/nn/moe.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/parallel/sharding_rules.hpp"
#include "distjax/parallel/zero.hpp"
#include "distjax/train/train_step.hpp"

namespace distjax::app {

using tensor::TensorTree;

namespace {

// The size of `axis` in ctx's mesh; 1 without a context or the axis.
int size_of(const spmd::DeviceContext* ctx, const char* axis) {
  return ctx != nullptr && ctx->mesh().has_axis(axis) ? ctx->mesh().axis_size(axis) : 1;
}


// One device, no mesh: the base strategy, reporting the device's memory (summary.json's
// memory_bytes_per_device) as the distributed strategies do.
class OneDevice final : public train::Strategy {
 public:
  OneDevice() { traits_.memory = &memory_; }

 private:
  MemoryStats memory_;
};

// A pipeline over "pipe" when the axis splits the model, or when the model only runs cut
// into chunks (no whole-model init).
bool pipelined(const spmd::DeviceContext* ctx, const Network& model) {
  if (ctx == nullptr || !ctx->mesh().has_axis("pipe")) return false;
  return ctx->mesh().axis_size("pipe") > 1 || !model.init;
}

}  // namespace

Composed::Composed(const config::TrainConfig& c, spmd::DeviceContext* ctx, Network model)
    : config_(&c),
      ctx_(ctx),
      model_(std::move(model)),
      precision_(precision_of(c)),
      fully_sharded_(c.parallelism.shard == config::Shard::Parameters),
      fsdp_{.axis = "data",
            .min_weight_size = c.parallelism.fsdp.min_weight_size,
            .modules = c.parallelism.fsdp.modules} {
  if (ctx == nullptr) {
    data_ = std::make_unique<OneDevice>();
    top_ = data_.get();
    return;
  }
  cp_ = context_parallel_of(c, ctx->mesh());
  if (cp_.active()) {
    DISTJAX_CHECK(model_.context_parallel != nullptr, ConfigError, "[", c.run.program,
                  "] a \"context\" axis of ", cp_.layout.size,
                  " devices needs a model whose sequence splits; this one has no context "
                  "parallelism (Network::context_parallel)");
    model_ = model_.context_parallel(cp_);
  }
  const parallel::TPPlan tp = tensor_parallel_of(c, ctx->mesh());
  if (tp.layout != parallel::TPLayout::None) {
    DISTJAX_CHECK(model_.tensor_parallel != nullptr, ConfigError, "[", c.run.program,
                  "] a \"model\" axis of ", ctx->mesh().axis_size("model"),
                  " devices needs a model with a tensor-parallel layout; this one has none "
                  "(Network::tensor_parallel)");
    model_ = model_.tensor_parallel(tp);
  }
  const mesh::Axes averaged = averaged_axes();
  const int zero = config::zero_stage(c.parallelism.shard);
  const parallel::DataParallelOptions options{
      .fully_sharded = fully_sharded_ ? mesh::Axes("data") : mesh::Axes(),
      .expert = size_of(ctx, nn::kExpertAxis) > 1 ? mesh::Axes(nn::kExpertAxis) : mesh::Axes(),
      // Under a context split the masks are drawn by global position, from the key of the
      // data replica: every device of a context group draws with the same key.
      .key_axes = cp_.active() ? std::optional<mesh::Axes>(mesh::Axes("data")) : std::nullopt};
  if (zero == 1 || zero == 2)
    data_ = std::make_unique<parallel::ZeroDataParallel>(*ctx, zero, averaged, &specs_, options);
  else
    data_ = std::make_unique<parallel::DataParallel>(*ctx, averaged, &specs_, options);
  top_ = data_.get();
  if (!pipelined(ctx, model_)) return;
  DISTJAX_CHECK(model_.pipeline != nullptr, ConfigError, "[", c.run.program,
                "] a \"pipe\" axis needs a model cut into chunks; this one cannot be pipelined");
  pipeline_ = std::make_unique<parallel::Pipeline>(
      *ctx, *model_.pipeline,
      parallel::PipelineOptions{.schedule = parallel::parse_schedule_kind(c.parallelism.schedule),
                                .microbatches = static_cast<int>(c.parallelism.microbatches),
                                .virtual_stages = static_cast<int>(c.parallelism.virtual_stages),
                                .fsdp = fully_sharded_ ? &fsdp_ : nullptr,
                                .precision = precision_},
      data_.get());
  top_ = pipeline_.get();
}

Composed::~Composed() = default;

mesh::Axes Composed::averaged_axes() const {
  // Each device of a context group trains on its share of the same sequences, and the
  // devices of an expert axis on examples of their own: gradients are averaged with the data
  // replicas' over all of them (the experts, split over "expert", over the others only).
  std::vector<std::string> axes{"data"};
  if (size_of(ctx_, nn::kExpertAxis) > 1) axes.emplace_back(nn::kExpertAxis);
  if (cp_.active()) axes.push_back(cp_.axis);
  return mesh::Axes(std::move(axes));
}

int Composed::data_parallel_size() const {
  return size_of(ctx_, "data") * size_of(ctx_, nn::kExpertAxis);
}

train::Batch Composed::local_batch(const train::Batch& batch) const {
  if (!cp_.active()) return batch;
  const int me = ctx_->axis_index(cp_.axis);
  return batch.map([&](const tensor::Tensor& t) { return cp_.layout.shard(t, 1, me); });
}

int Composed::replica() const {
  // An expert axis is carved out of the data replicas: its devices see examples of their own.
  if (ctx_ == nullptr) return 0;
  const int data = ctx_->mesh().has_axis("data") ? ctx_->axis_index("data") : 0;
  const int ep = size_of(ctx_, nn::kExpertAxis);
  return ep > 1 ? data * ep + ctx_->axis_index(nn::kExpertAxis) : data;
}

train::TrainState Composed::create_state(const optim::Optimizer& optimizer, Key init_key,
                                         Key dropout_key) {
  const nn::FullySharded* fsdp = fully_sharded_ ? &fsdp_ : nullptr;
  TensorTree params = pipeline_
                          ? model_.pipeline->init(init_key, pipeline_->chunks(),
                                                  pipeline_->num_chunks(), &specs_, ctx_, fsdp)
                          : model_.init(init_key, &specs_, ctx_, fsdp);
  train::TrainState state =
      train::TrainState::create(std::move(params), optimizer, dropout_key, *top_);
  if (ctx_ != nullptr)
    parallel::check_sharding(
        specs_, ctx_->mesh(),
        {.data_axes = averaged_axes(),
         .fully_sharded_axes = fully_sharded_ ? mesh::Axes("data") : mesh::Axes(),
         .pipeline_axes = pipeline_ ? mesh::Axes("pipe") : mesh::Axes(),
         .expert_axes = size_of(ctx_, nn::kExpertAxis) > 1 ? mesh::Axes(nn::kExpertAxis)
                                                           : mesh::Axes()});
  if (config_->distributed.mixed_precision == config::MixedPrecision::Fp16)
    state.loss_scale = train::DynamicLossScale{};
  return state;
}

train::LossFn Composed::loss(bool train) const {
  if (pipeline_) return train ? pipeline_->module_loss() : train::LossFn{};
  return [this, train](const TensorTree& params, const train::Batch& batch, Key key) {
    nn::Scope scope = nn::Scope::apply(&params, train, key);
    if (ctx_ != nullptr) scope = scope.on(*ctx_);
    scope = scope.with_precision(precision_);
    if (fully_sharded_) scope = scope.fully_sharded(fsdp_);
    return model_.loss(scope, batch);
  };
}

train::Metrics Composed::evaluate(const TensorTree& params,
                                  const std::vector<train::Batch>& batches) {
  train::Metrics metrics;
  if (pipeline_) {
    for (const train::Batch& b : batches)
      metrics.merge(pipeline_->evaluate(params, b));
    return metrics;
  }
  metrics = train::evaluate(params, batches, loss(false), Key{});
  return top_->reduce_metrics(std::move(metrics));
}

nn::Precision precision_of(const config::TrainConfig& c) {
  switch (c.distributed.mixed_precision) {
    case config::MixedPrecision::Bf16:
      return nn::Precision::bf16();
    case config::MixedPrecision::Fp16:
      return nn::Precision::fp16();
    case config::MixedPrecision::No:
      break;
  }
  return nn::Precision::f32();
}

parallel::TPPlan tensor_parallel_of(const config::TrainConfig& c, const mesh::Mesh& mesh) {
  const bool split = mesh.has_axis("model") && mesh.axis_size("model") > 1;
  return {.layout = split ? parallel::tp_layout_from_name(c.parallelism.tp_layout)
                          : parallel::TPLayout::None,
          .sequence_parallel = c.parallelism.sequence_parallel,
          .vocab_parallel = c.parallelism.vocab_parallel,
          .bidirectional = c.parallelism.bidirectional};
}

parallel::ContextPlan context_parallel_of(const config::TrainConfig& c, const mesh::Mesh& mesh) {
  parallel::ContextPlan plan;
  plan.layout = {.size = mesh.has_axis(plan.axis) ? mesh.axis_size(plan.axis) : 1,
                 .balanced = c.parallelism.context_balance};
  plan.method = parallel::context_method_from_name(c.parallelism.context_parallel_method);
  return plan;
}

bool remat_of(const config::TrainConfig& c, const std::string& module) {
  return std::find(c.parallelism.remat.begin(), c.parallelism.remat.end(), module) !=
         c.parallelism.remat.end();
}

}  // namespace distjax::app
