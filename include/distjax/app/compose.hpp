// The one place where the parallelisms a config names compose, as torchtitan's
// parallelize does: the tensor-parallel layout over "model" (parallelism.tp_layout, applied
// through the model's own transform, Network::tensor_parallel), data parallelism, ZeRO-1/2
// or fully sharded parameters over "data" (parallelism.shard), a pipeline over "pipe", and
// the precision of the scopes the model runs on. app::train gives a model's Network and
// gets, on each device, one strategy for the train step, the parameters this device holds,
// the loss functions and an evaluation, whatever the mesh: the same device program runs
// pipelined or not, tensor parallel or not.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distjax/config/train_config.hpp"
#include "distjax/nn/precision.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/optim/optimizer.hpp"
#include "distjax/parallel/context_parallel.hpp"
#include "distjax/parallel/pipeline.hpp"
#include "distjax/parallel/tp_layout.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/train/loss.hpp"
#include "distjax/train/strategy.hpp"
#include "distjax/train/train_state.hpp"

namespace distjax::app {

/// A model as the composition needs it.
struct Network {
  /// The whole model's parameters (null for a model that only runs cut into chunks: it
  /// is pipelined even over a "pipe" axis of size 1) (this device's shards when `ctx` is given;
  /// stored fully sharded as `fsdp` says when it is not null), their specs recorded in `specs`.
  std::function<tensor::TensorTree(Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                                   const nn::FullySharded* fsdp)>
      init{};
  /// The mean loss of a batch and its metrics, on a scope the composition prepares.
  std::function<std::pair<tensor::Tensor, train::Metrics>(const nn::Scope& scope,
                                                          const train::Batch& batch)>
      loss{};
  /// The model cut into chunks, run over a "pipe" axis; null: it cannot be pipelined.
  const parallel::PipelineModule* pipeline = nullptr;
  /// Keeps alive what the functions and `pipeline` refer to (e.g. the model object); may be
  /// empty when the caller keeps it.
  std::shared_ptr<const void> keep{};
  /// The same model laid out over a tensor-parallel axis as `tp` says: the model's TP plan
  /// (which layers split how), applied by the composition when the mesh's "model" axis
  /// has more than one device. It throws ConfigError for a layout the model lacks. Null:
  /// the model has no tensor-parallel layout, and such a mesh is refused.
  std::function<Network(const parallel::TPPlan& tp)> tensor_parallel{};
  /// The same model with its sequence split over a "context" axis as `cp` says (its
  /// attention crossing the split; the batches the composition hands it are this device's
  /// share of each sequence: Composed::local_batch). Null: the model has no context
  /// parallelism, and such a mesh is refused.
  std::function<Network(const parallel::ContextPlan& cp)> context_parallel{};
  /// After each optimizer step, on every device, with that step's metrics (summed over its
  /// micro-batches and the devices that see other examples): updates the parameters the
  /// gradient does not (an MoE layer's balancing bias). Null: nothing to do.
  std::function<void(tensor::TensorTree& params, const train::Metrics& step)> after_update{};
};

/// The strategies of `config` on one device (every device builds its own, in the same
/// order: the constructors of ZeRO and the pipeline talk to the other devices):
/// - over "context" (size > 1): the model's sequence split as context_parallel_of(config,
///   mesh) says, by Network::context_parallel; the gradients are then averaged over "data"
///   and "context" together (each device's loss is the mean over its share of the tokens);
/// - over "model" (size > 1): the model laid out as tensor_parallel_of(config, mesh) says,
///   by Network::tensor_parallel;
/// - over "data": ZeroDataParallel when parallelism.zero_stage is 1 or 2, else DataParallel
///   (its parameters stored fully sharded over "data" when parallelism.fsdp.modules names
///   modules: FSDP is a property of the scopes, below);
/// - over "pipe" (size > 1, or any size for a model without a whole-model init): a Pipeline under
/// parallelism.schedule, with the data strategy
///   inside each stage;
/// - the scopes of the loss: on the device, with the precision of
///   distributed.mixed_precision and the fully sharded configuration.
/// Without a device context (one device, no mesh): the base strategy, reporting memory.
class Composed {
 public:
  Composed(const config::TrainConfig& config, spmd::DeviceContext* ctx, Network model);
  ~Composed();
  Composed(const Composed&) = delete;
  Composed& operator=(const Composed&) = delete;

  /// The strategy the train step runs through: the pipeline when there is one.
  train::Strategy& strategy() { return *top_; }
  /// The model as this device runs it (tensor parallel when the mesh says so).
  const Network& network() const { return model_; }
  /// The pipeline over "pipe"; null without one.
  parallel::Pipeline* pipeline() { return pipeline_.get(); }
  /// The PartitionSpec of every parameter this device created (filled by create_state).
  const nn::ParamSpecs& specs() const { return specs_; }
  const nn::Precision& precision() const { return precision_; }
  bool fully_sharded() const { return fully_sharded_; }
  /// How many devices see different examples (the global batch over this is the local):
  /// the size of "data" times that of "expert" (1 without a mesh).
  int data_parallel_size() const;
  /// This device's share of a batch of its data replica: under context parallelism the
  /// positions of each sequence it holds (ContextLayout::shard along dimension 1 of every
  /// tensor), else the batch itself.
  train::Batch local_batch(const train::Batch& batch) const;
  /// The context parallelism this device runs (inactive without a "context" axis).
  const parallel::ContextPlan& context_plan() const { return cp_; }
  /// This device's index among those that see different examples: along "data", and with
  /// an "expert" axis data x expert size + its index there (0 without a mesh).
  int replica() const;

  /// The train state of this device: its parameters (its stage's chunks under a pipeline)
  /// from `init_key`, the optimizer state the strategy keeps, the dropout key; a dynamic
  /// loss scale with mixed_precision = "fp16". The sharding is linted
  /// (parallel::check_sharding: a weight split over "data" without FSDP, an axis no
  /// strategy uses, a spec naming an axis the mesh lacks).
  train::TrainState create_state(const optim::Optimizer& optimizer, Key init_key, Key dropout_key);

  /// The loss function of a train step (`train`: dropout on) or of an evaluation. Under
  /// a pipeline the train step's is the pipeline's module loss (Pipeline::module_loss).
  train::LossFn loss(bool train) const;
  /// The metrics of `batches` (this device's share of the evaluation set: each data replica
  /// its own, every device of a replica the same), merged over the mesh: a collective,
  /// run alike on every device. Under a pipeline: Pipeline::evaluate.
  train::Metrics evaluate(const tensor::TensorTree& params,
                          const std::vector<train::Batch>& batches);

 private:
  /// The axes the data strategy averages over: "data", and "context" under a context split.
  mesh::Axes averaged_axes() const;

  const config::TrainConfig* config_;
  spmd::DeviceContext* ctx_;
  Network model_;
  parallel::ContextPlan cp_;
  nn::ParamSpecs specs_;
  nn::Precision precision_;
  bool fully_sharded_ = false;
  nn::FullySharded fsdp_;
  std::unique_ptr<train::Strategy> data_;
  std::unique_ptr<parallel::Pipeline> pipeline_;
  train::Strategy* top_ = nullptr;
};

/// The nn::Precision policy of distributed.mixed_precision: "no" f32, "bf16" bf16
/// matmuls, "fp16" f16 matmul operands; f32 master weights in every case.
nn::Precision precision_of(const config::TrainConfig& c);

/// The tensor parallelism `config` asks of a model on `mesh`: parallelism.tp_layout over
/// "model" (none when the axis is absent or of size 1), sequence and vocabulary
/// parallelism, bidirectional rings.
parallel::TPPlan tensor_parallel_of(const config::TrainConfig& c, const mesh::Mesh& mesh);

/// The context parallelism `config` asks of a model on `mesh`: the "context" axis's size
/// (inactive when the axis is absent or of size 1), parallelism.context_balance and
/// parallelism.context_parallel_method.
parallel::ContextPlan context_parallel_of(const config::TrainConfig& c, const mesh::Mesh& mesh);

/// Whether parallelism.remat names `module` ("Block", "Attn", "MLP").
bool remat_of(const config::TrainConfig& c, const std::string& module);

}  // namespace distjax::app
