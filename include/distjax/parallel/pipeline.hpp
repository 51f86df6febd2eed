// Pipeline parallelism: a model cut into chunks along its depth, one stage of chunks per
// device along the "pipe" mesh axis, run by an executor over a checked schedule
// (parallel/pipeline_schedule.hpp), composed with the strategy of the other axes.
// Legend: p stages, m micro-batches, v chunks per stage; B batch, b = B/m micro-batch.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/parallel/pipeline_schedule.hpp"
#include "distjax/train/strategy.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/train/batch.hpp"
#include "distjax/train/metrics.hpp"

namespace distjax::parallel {

using tensor::TensorTree;

/// A model cut into `num_chunks` chunks along its depth. Parameters keep the paths of the
/// whole model; a stage creates and holds only the parameters of its chunks.
class PipelineModule {
 public:
  virtual ~PipelineModule() = default;

  /// Forward of chunk `chunk` of `num_chunks` on one micro-batch `mb`. Chunk 0 reads
  /// mb.inputs (`x` undefined); the others get the previous chunk's output `x`. A chunk
  /// other than the last returns the activation it passes on; the last returns the
  /// micro-batch's scalar mean loss and adds its metrics as (sum, count) to `metrics`
  /// (a "loss" entry is added as (loss * b, b) when it adds none).
  virtual tensor::Tensor forward(const nn::Scope& scope, int chunk, int num_chunks,
                                 const tensor::Tensor& x, const train::Batch& mb,
                                 train::Metrics& metrics) const = 0;

  /// The local shape of the activation chunk `chunk` (not the last) passes on for `mb` on
  /// the device of `scope`, and the mesh axes it varies over besides the micro-batch's
  /// (e.g. the model axis when tensor parallelism splits its features): the receiving
  /// stage posts its receive with them before the sender has computed anything.
  virtual Shape activation_shape(const nn::Scope& scope, int chunk, int num_chunks,
                                 const train::Batch& mb) const = 0;
  virtual mesh::Axes activation_axes() const { return mesh::Axes(); }

  /// The names of the metrics the last chunk reports (the other stages report them as
  /// zeros, so the metrics merge over the pipe axis).
  virtual std::vector<std::string> metric_names() const { return {"loss"}; }

  /// Parameters of `chunks` only (paths as in the whole model), each parameter's value the
  /// one the whole model's init gives it. `specs`, `ctx` and `fsdp` as in the models' init.
  virtual TensorTree init(Key key, const std::vector<int>& chunks, int num_chunks,
                          nn::ParamSpecs* specs = nullptr, spmd::DeviceContext* ctx = nullptr,
                          const nn::FullySharded* fsdp = nullptr) const = 0;
};

/// The layers [first, last) of each of `num_chunks` chunks of a `num_layers` deep stack:
/// balanced by count (the first num_layers % num_chunks chunks one layer more), or
/// `explicit_sizes` when given (one size per chunk, summing to num_layers). ConfigError
/// when a chunk would be empty ("more stages than layers") or the sizes do not add up.
std::vector<std::pair<int, int>> partition_layers(int num_layers, int num_chunks,
                                                  const std::vector<int>& explicit_sizes = {});

/// Options of a Pipeline.
struct PipelineOptions {
  mesh::Axes axis = "pipe";
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int microbatches = 4;    ///< m; the local batch must be divisible by it
  int virtual_stages = 1;  ///< v (Interleaved1F1B, InterleavedZeroBubble)
  /// The zero-bubble kinds: the F, I and W durations (of one chunk) the
  /// schedule is built with (unit: the paper's equal costs; profiled durations place the W
  /// actions where this model's bubbles are).
  ActionCosts costs{};
  /// Parameters stored fully sharded (ZeRO-3) inside each stage: the scope the chunks run
  /// on gets this configuration (the parameters must come from init with the same one).
  const nn::FullySharded* fsdp = nullptr;
  /// The mixed-precision policy of the scopes the chunks run on (nn/precision.hpp). With
  /// f16, give the TrainState a loss scale (train::DynamicLossScale) and the train step a
  /// loss function (module_loss()): train_step scales that function's loss, which the
  /// pipeline differentiates on the last stage.
  nn::Precision precision{};
};

/// One span of a device's step: a compute action, or the time it waited for a transfer.
struct PipelineSpan {
  PipelineAction action;
  std::size_t index = 0;  ///< the action's index in the stage's list
  bool wait = false;      ///< waiting for a receive (or for sends at the end), not computing
  double start = 0.0;     ///< seconds on the steady clock
  double end = 0.0;
  double cpu = 0.0;       ///< CPU seconds of this device's thread during the span
};

/// The spans of this device's last step.
struct PipelineTrace {
  int stage = 0;
  double start = 0.0, end = 0.0;    ///< the step on this device (steady clock seconds)
  std::vector<PipelineSpan> spans;
  int peak_in_flight = 0;           ///< micro-batch chunks held between F and B (or W)
  double compute_seconds() const;   ///< sum of the compute spans
  double wait_seconds() const;      ///< sum of the wait spans
  /// 1 - compute / (end - start): the share of the step this device did not compute.
  double idle_fraction() const;
};

/// The measured bubble of a step: the mean over the pipe axis of the devices' idle
/// fractions. With `shared_clock` (the threads backend: every device reads one steady
/// clock) each device's step runs from the earliest start to the latest end along the
/// axis, as in the theory; otherwise (processes, each clock with its own origin) from its
/// own start to its own end. Collective over `axis` (an all_gather of three numbers): call
/// it on every device after the step, with the starts aligned by a barrier before it.
double pipeline_bubble(spmd::DeviceContext& ctx, const PipelineTrace& trace, bool shared_clock,
                       const mesh::Axes& axis = "pipe");

/// A text timeline of measured steps, one row per trace (stage), `width` cells from the
/// earliest start to the latest end: "F"/"B"/"I"/"W" where the device computed (the
/// micro-batch's last digit in the next cell when it fits), "." where it waited or idled.
std::string format_trace_timeline(const std::vector<PipelineTrace>& traces, int width = 96);

/// The traces as a Chrome trace (JSON that chrome://tracing and Perfetto open): one
/// process per device (`devices[i]` names traces[i]), complete events for its compute
/// spans (category "compute", named like "F mb 3 chunk 1"), its waits for transfers
/// ("communication") and the gaps between them ("idle"); times in microseconds from the
/// earliest start.
std::string chrome_trace_json(const std::vector<PipelineTrace>& traces,
                              const std::vector<int>& devices);

/// The pipeline Strategy. forward_backward runs this stage's action list of the checked
/// schedule over the micro-batches of the batch, the train step's loss function in place of
/// the module's last chunk (module_loss(); null: the last chunk itself): forwards keep
/// their micro-batch's activations until its backward frees them; activations and
/// cotangents travel to the neighbouring stages by asynchronous point-to-point over the
/// pipe axis (receives posted ahead, sends left in flight, each the schedule's send_act or
/// send_grad), so transfers overlap compute; the gradients of the
/// micro-batches are summed into this stage's gradients (each loss seeded with 1/m: the
/// mean over the batch). Zero-bubble schedules defer the weight products of linear layers
/// to the W actions (tensor::WeightGradStore).
///
/// The other axes keep their strategy, `inner` (data parallel, ZeRO, tensor parallel; null
/// for none): its own_params/own_batch marks are applied, then finalize_grads,
/// init_opt_state and apply_update run on this stage's parameters among the devices of
/// the stage; the metrics are summed over the pipe axis first; the gradient norm is the
/// inner one summed over the stages. Parameters and the batch are marked as varying over
/// the pipe axis (each stage has its own).
///
///   parallel::DataParallel dp(ctx, "data");
///   parallel::Pipeline pp(ctx, gpt_pipe, {.schedule = ScheduleKind::OneFOneB, .microbatches = 8}, &dp);
///   TensorTree params = gpt_pipe.init(key, pp.chunks(), pp.num_chunks(), &specs, &ctx);
///   train::train_step(state, local_batch, pp.module_loss(), opt, {.strategy = &pp});
class Pipeline final : public train::Strategy {
 public:
  Pipeline(spmd::DeviceContext& ctx, const PipelineModule& module, PipelineOptions options = {},
           train::Strategy* inner = nullptr);

  /// The module's last chunk as a train::LossFn: what a LossFn means under a pipeline
  /// (Megatron's loss function on the last stage), and what a null one stands for.
  /// forward_backward calls the train step's loss function on the last stage once per
  /// micro-batch, in place of the last chunk's forward, as
  ///   loss_fn(params, {x, mb.labels, mb.documents}, key)
  /// with params this stage's parameters (tape leaves), x the activation the last chunk
  /// receives ((b, ...), on the tape: the cotangent flows back through it; mb.inputs when
  /// the last chunk is also the first), mb the micro-batch (b examples; every stage has
  /// it, so a packed batch's documents reach every chunk's attention) and key the
  /// micro-batch's key; it returns the micro-batch's scalar mean loss, which the pipeline
  /// differentiates (seeded with 1/m), and its metrics ("loss" added as (loss * b, b) when
  /// absent). A wrapper of this function (train_step's loss scaling) therefore applies
  /// under a pipeline as on one device:
  ///   state.loss_scale = train::DynamicLossScale{};   // f16: PipelineOptions::precision
  ///   train::train_step(state, local_batch, pp.module_loss(), opt, {.strategy = &pp});
  /// The function runs the last chunk on chunk_scope (precision, FSDP, this device).
  train::LossFn module_loss() const;
  Key step_key(const Key& key) override { return inner_ ? inner_->step_key(key) : key; }
  train::GradientResult forward_backward(const train::LossFn& loss_fn, const TensorTree& params,
                                         const train::Batch& batch, const Key& key,
                                         int num_minibatches) override;
  TensorTree finalize_grads(TensorTree grads) override;
  /// The inner strategy's (data parallelism: each bucket updated as it arrives).
  TensorTree finalize_and_update(TensorTree grads, const optim::Optimizer& optimizer,
                                 TensorTree& params, TensorTree& opt_state,
                                 std::int64_t step) override;
  bool streams_update(const optim::Optimizer& optimizer) const override {
    return inner_ && inner_->streams_update(optimizer);
  }
  train::Metrics reduce_metrics(train::Metrics metrics) override;
  /// Forward only (no grad, no dropout), micro-batch by micro-batch through the stages:
  /// the metrics of `batch` (this device's slice), summed over the pipe axis and reduced
  /// by the inner strategy like a train step's. Collective over the mesh.
  train::Metrics evaluate(const TensorTree& params, const train::Batch& batch);
  double grad_norm_squared(const TensorTree& grads) override;
  TensorTree init_opt_state(const optim::Optimizer& optimizer, const TensorTree& params) override;
  void apply_update(const optim::Optimizer& optimizer, TensorTree& params, const TensorTree& grads,
                    TensorTree& opt_state, std::int64_t step) override;
  /// The inner strategy's (checkpoints: this stage's optimizer state).
  TensorTree opt_state_to_param_layout(const TensorTree& opt_state,
                                       const TensorTree& params) override;
  TensorTree opt_state_from_param_layout(const TensorTree& state,
                                         const TensorTree& params) override;

  /// This device's stage (its index along the pipe axis) and the chunks it holds.
  int stage() const { return stage_; }
  int num_stages() const { return schedule_.stages; }
  int num_chunks() const { return schedule_.num_chunks(); }
  std::vector<int> chunks() const { return schedule_.chunks_of(stage_); }
  /// Whether this stage computes the loss (holds the last chunk).
  bool is_last_stage() const { return schedule_.stage_of(num_chunks() - 1) == stage_; }
  const PipelineSchedule& schedule() const { return schedule_; }
  const ScheduleReport& schedule_report() const { return report_; }
  /// The spans of the last forward_backward on this device.
  const PipelineTrace& last_trace() const { return trace_; }
  /// Whether the next steps' spans are in the device's time: on a GPU each span boundary
  /// then waits for this device's stream (kernels run asynchronously, so the host's clock
  /// alone times their launch), which costs the overlap of those steps: turn it on for the
  /// steps whose timeline is kept. Off by default; a CPU's spans are its time either way.
  void time_on_device(bool on) { device_time_ = on; }

 private:
  // The scope a chunk runs on: `params`, training, `key`, this device, the options'
  // precision and FSDP.
  nn::Scope chunk_scope(const TensorTree& params, const Key& key) const;
  /// The batch's tensors marked as varying over the pipe axis (each stage its own use).
  train::Batch vary_over_pipe(const train::Batch& batch) const;
  // Parameters with this stage's marks (inner's, plus the pipe axis).
  TensorTree stage_params(const TensorTree& params);
  // One run of this stage's action list over `batch` (pipeline.cpp): the state of the
  // run in a Step, one function per kind of action.
  struct Step;
  train::GradientResult run_schedule(const train::LossFn& loss_fn, const TensorTree& params,
                                     const train::Batch& batch, const Key& key);
  void post_receives(Step& step, bool grad);
  tensor::Tensor receive(Step& step, const PipelineAction& a);
  void send(Step& step, const tensor::Tensor& t, int to, int tag);
  void run_forward(Step& step, const PipelineAction& a);
  tensor::Tensor forward_input(Step& step, const PipelineAction& a);
  void run_backward(Step& step, const PipelineAction& a);  // B and I
  tensor::Tensor output_cotangent(Step& step, const PipelineAction& a);
  void run_weight_backward(Step& step, const PipelineAction& a);
  void record_span(Step& step, const PipelineAction& a, bool wait, double t0);
  train::GradientResult finish_step(Step& step);
  // grads with the pipe axis taken out of their marks (collectives of the inner strategy
  // run among the devices of one stage).
  TensorTree without_pipe(const TensorTree& tree) const;

  spmd::DeviceContext* ctx_;
  const PipelineModule* module_;
  PipelineOptions options_;
  train::Strategy* inner_;
  int stage_ = 0;
  std::uint32_t pipe_mask_ = 0;
  PipelineSchedule schedule_;
  ScheduleReport report_;
  PipelineTrace trace_;
  bool device_time_ = false;
  // The clock of the trace's spans (see time_on_device).
  double trace_now() const;
};

}  // namespace distjax::parallel
