#include "distjax/parallel/pipeline.hpp"


#include <chrono>
#include <ctime>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/optim/clip.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/tensor/device_memory.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/inplace_ops.hpp"

namespace distjax::parallel {

using tensor::Tensor;

namespace {

// Tags of the pipeline's point-to-point traffic (ppermute uses kMaxTag - 1 and - 2):
// activations and cotangents are separate FIFO channels.
constexpr int kActivationTag = comm::kMaxTag - 3;
constexpr int kGradTag = comm::kMaxTag - 4;
// How many receives per channel are posted ahead of the action that needs them.
constexpr std::size_t kReceiveLookahead = 2;

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// acc[path] += g (first time: a private copy).
void accumulate(TensorTree& acc, const std::string& path, const Tensor& g) {
  if (!g.defined()) return;
  if (!acc.contains(path)) {
    acc.set(path, g.clone());
    return;
  }
  tensor::add_into(acc.at(path), g);
}

}  // namespace

std::vector<std::pair<int, int>> partition_layers(int num_layers, int num_chunks,
                                                  const std::vector<int>& explicit_sizes) {
  DISTJAX_CHECK(num_chunks >= 1, ConfigError, "[partition_layers] num_chunks must be >= 1, got ",
                num_chunks);
  std::vector<int> sizes = explicit_sizes;
  if (sizes.empty()) {
    DISTJAX_CHECK(num_layers >= num_chunks, ConfigError, "[partition_layers] more stages than "
                  "layers: ", num_chunks, " chunks (stages x virtual stages) for ", num_layers,
                  " layers; every chunk needs at least one layer");
    for (int c = 0; c < num_chunks; ++c)
      sizes.push_back(num_layers / num_chunks + (c < num_layers % num_chunks ? 1 : 0));
  }
  DISTJAX_CHECK(static_cast<int>(sizes.size()) == num_chunks, ConfigError,
                "[partition_layers] ", sizes.size(), " explicit sizes for ", num_chunks, " chunks");
  std::vector<std::pair<int, int>> out;
  int first = 0;
  for (int c = 0; c < num_chunks; ++c) {
    DISTJAX_CHECK(sizes[c] >= 1, ConfigError, "[partition_layers] chunk ", c, " has ", sizes[c],
                  " layers; every chunk needs at least one");
    out.emplace_back(first, first + sizes[c]);
    first += sizes[c];
  }
  DISTJAX_CHECK(first == num_layers, ConfigError, "[partition_layers] the sizes add up to ", first,
                " layers, the model has ", num_layers);
  return out;
}

Pipeline::Pipeline(spmd::DeviceContext& ctx, const PipelineModule& module, PipelineOptions options,
                   train::Strategy* inner)
    : ctx_(&ctx), module_(&module), options_(options), inner_(inner) {
  const int p = ctx.axis_size(options_.axis);
  stage_ = ctx.axis_index(options_.axis);
  pipe_mask_ = ctx.axis_mask(options_.axis);
  if (inner) {
    const std::string problem = inner->problem_as_inner();
    DISTJAX_CHECK(problem.empty(), ConfigError, "[Pipeline] inner strategy ", inner->name(), ": ",
                  problem);
  }
  schedule_ = make_schedule(options_.schedule, p, options_.microbatches, options_.virtual_stages,
                            options_.costs);
  report_ = check_schedule(schedule_);  // proven before anything runs
  std::ostringstream os;
  os << "pipe(" << to_string(schedule_.kind) << ", " << options_.axis.str() << "="
     << schedule_.stages << ", m=" << schedule_.microbatches;
  if (schedule_.virtual_stages > 1) os << ", v=" << schedule_.virtual_stages;
  os << ")";
  if (inner_) os << " x " << inner_->name();
  traits_.name = os.str();
  traits_.data_parallel_size = inner_ ? inner_->data_parallel_size() : 1;
  traits_.local_grad_norm = false;
  traits_.memory = &ctx.memory();
}

train::Batch Pipeline::vary_over_pipe(const train::Batch& batch) const {
  return batch.map([&](Tensor t) {
    t.set_varying_axes(t.varying_axes() | pipe_mask_);
    return t;
  });
}

nn::Scope Pipeline::chunk_scope(const TensorTree& params, const Key& key) const {
  nn::Scope scope = nn::Scope::apply(&params, /*train=*/true, key)
                        .on(*ctx_)
                        .with_precision(options_.precision);
  return options_.fsdp ? scope.fully_sharded(*options_.fsdp) : scope;
}

train::LossFn Pipeline::module_loss() const {
  return [this](const TensorTree& params, const train::Batch& batch, Key key) {
    const int last = num_chunks() - 1;
    train::Metrics metrics;
    Tensor loss = module_->forward(chunk_scope(params, key), last, last + 1,
                                   last == 0 ? Tensor() : batch.inputs, batch, metrics);
    return std::make_pair(std::move(loss), std::move(metrics));
  };
}


TensorTree Pipeline::stage_params(const TensorTree& params) {
  TensorTree own = inner_ ? inner_->own_params(params) : params;
  TensorTree out;
  for (const auto& [path, p] : own) {
    Tensor t = p;
    t.set_varying_axes(t.varying_axes() | pipe_mask_);
    out.set(path, t);
  }
  return out;
}

TensorTree Pipeline::without_pipe(const TensorTree& tree) const {
  TensorTree out;
  for (const auto& [path, t] : tree) {
    Tensor v = t;
    v.set_varying_axes(v.varying_axes() & ~pipe_mask_);
    out.set(path, v);
  }
  return out;
}

train::GradientResult Pipeline::forward_backward(const train::LossFn& loss_fn,
                                                 const TensorTree& params,
                                                 const train::Batch& batch, const Key& key,
                                                 int num_minibatches) {
  DISTJAX_CHECK(num_minibatches >= 1 && batch.size() % num_minibatches == 0, InvalidArgument,
                "[Pipeline] batch size ", batch.size(), " is not divisible by num_minibatches ",
                num_minibatches);
  if (num_minibatches == 1) return run_schedule(loss_fn, params, batch, key);
  // Gradient accumulation around the pipeline: one schedule per minibatch, averaged.
  const std::int64_t n = batch.size() / num_minibatches;
  train::GradientResult out;
  for (int i = 0; i < num_minibatches; ++i) {
    train::GradientResult r = run_schedule(loss_fn, params, batch.slice(i * n, (i + 1) * n),
                                           key.fold_in(static_cast<std::uint64_t>(i)));
    out.metrics.merge(r.metrics);
    if (i == 0) {
      out.grads = std::move(r.grads);
    } else {
      tensor::NoGradGuard no_grad;
      for (const auto& [path, g] : r.grads)
        accumulate(out.grads, path, g);
    }
  }
  tensor::NoGradGuard no_grad;
  optim::scale_in_place(out.grads, 1.0 / num_minibatches);  // as train::accumulate_gradients
  return out;
}

// The state of one run of this stage's action list.
struct Pipeline::Step {
  // A receive posted ahead of the action that needs it.
  struct Posted {
    PipelineAction action;
    Tensor buffer;
    comm::Request request;
  };
  // One FIFO channel of receives (activations or cotangents), posted in list order.
  struct Channel {
    PipelineOp op;
    int tag;
    std::deque<Posted> posted;
    std::size_t scan = 0;  // next list index to look at for a receive
  };
  // A send in flight, with the buffer it reads.
  struct Sent {
    Tensor buffer;
    comm::Request request;
  };
  // A forwarded micro-batch chunk, held until its backward.
  struct Live {
    Tensor input;   // leaf of the received activation (undefined for chunk 0)
    Tensor output;  // activation passed on, or the loss
    tensor::WeightGradStore deferred;
  };
  using Slot = std::pair<int, int>;  // (micro-batch, chunk)

  const std::vector<PipelineAction>& actions;
  const train::LossFn& loss_fn;  // the train step's; null: the module's last chunk
  train::Batch batch;  // with this stage's marks
  Key key;
  std::int64_t b = 0;  // micro-batch size
  std::uint32_t act_mask = 0;  // marks of a received activation or cotangent
  TensorTree marked, leaves;   // the stage's parameters, and their tape leaves
  std::vector<Tensor> leaf_list{};
  std::vector<std::string> leaf_paths{};
  std::map<const tensor::Node*, std::string> path_of_node{};
  nn::Scope shape_scope;
  Channel act{PipelineOp::RecvActivation, kActivationTag, {}};
  Channel grad{PipelineOp::RecvGrad, kGradTag, {}};
  std::deque<Sent> sends{};
  std::map<Slot, Live> live{};
  std::map<Slot, Tensor> received_act{}, received_grad{};  // keyed by own chunk
  std::map<Slot, Tensor> local_act{}, local_grad{};        // neighbour on this stage
  std::map<Slot, Tensor> outgoing_grad{};                  // input cotangents for send_grad
  TensorTree acc{};  // summed parameter cotangents
  train::GradientResult out{};
  int in_flight = 0;
  std::size_t index = 0;  // of the action running
  double cpu0 = 0.0;      // thread CPU time at its start

  train::Batch micro_batch(int i) const { return batch.slice(i * b, (i + 1) * b); }
  // The value stored for `slot` in `from`, taken out of it (null when absent).
  static std::optional<Tensor> take(std::map<Slot, Tensor>& from, const Slot& slot) {
    auto it = from.find(slot);
    if (it == from.end()) return std::nullopt;
    Tensor t = std::move(it->second);
    from.erase(it);
    return t;
  }
};

train::GradientResult Pipeline::run_schedule(const train::LossFn& loss_fn, const TensorTree& params,
                                             const train::Batch& batch_in, const Key& key) {
  const int m = schedule_.microbatches;
  DISTJAX_CHECK(batch_in.size() % m == 0, InvalidArgument, "[Pipeline] local batch size ",
                batch_in.size(), " is not divisible by ", m,
                " micro-batches; choose a batch that is a multiple of it");
  train::Batch batch = inner_ ? inner_->own_batch(batch_in) : batch_in;
  batch = vary_over_pipe(batch);
  TensorTree marked = stage_params(params);
  TensorTree leaves = autodiff::detail::make_leaves(marked);
  Step step{.actions = schedule_.actions[stage_],
            .loss_fn = loss_fn,
            .batch = batch,
            .key = key,
            .b = batch_in.size() / m,
            .act_mask = batch.inputs.varying_axes() |
                        ctx_->axis_mask(module_->activation_axes()) | pipe_mask_,
            .marked = std::move(marked),
            .leaves = std::move(leaves),
            .shape_scope = nn::Scope::apply(&step.leaves, /*train=*/true).on(*ctx_)};
  for (const auto& [path, t] : step.leaves) {
    if (!t.requires_grad()) continue;
    step.leaf_list.push_back(t);
    step.leaf_paths.push_back(path);
    step.path_of_node[t.grad_node().get()] = path;
  }
  trace_ = PipelineTrace{};
  trace_.stage = stage_;
  trace_.start = trace_now();

  post_receives(step, /*grad=*/false);
  post_receives(step, /*grad=*/true);
  for (; step.index < step.actions.size(); ++step.index) {
    const PipelineAction& a = step.actions[step.index];
    switch (a.op) {
      case PipelineOp::RecvActivation:
        step.received_act[{a.microbatch, a.chunk}] = receive(step, a);
        break;
      case PipelineOp::RecvGrad:
        step.received_grad[{a.microbatch, a.chunk}] = receive(step, a);
        break;
      case PipelineOp::SendActivation:
        send(step, step.live.at({a.microbatch, a.chunk}).output, schedule_.stage_of(a.chunk + 1),
             kActivationTag);
        break;
      case PipelineOp::SendGrad: {
        // The cotangent of chunk c's input that the backward before this action computed.
        std::optional<Tensor> g = Step::take(step.outgoing_grad, {a.microbatch, a.chunk});
        DISTJAX_CHECK(g.has_value(), Error, "[Pipeline] stage ", stage_, ": ",
                      describe(a, schedule_), " before the backward that computes it");
        send(step, *g, schedule_.stage_of(a.chunk - 1), kGradTag);
        break;
      }
      case PipelineOp::Forward:
        run_forward(step, a);
        break;
      case PipelineOp::Backward:
      case PipelineOp::BackwardInput:
        run_backward(step, a);
        break;
      case PipelineOp::BackwardWeight:
        run_weight_backward(step, a);
        break;
    }
  }
  return finish_step(step);
}

double Pipeline::trace_now() const {
  if (device_time_) tensor::raw::synchronize("pipeline timeline", current_device());
  return now_s();
}

void Pipeline::record_span(Step& step, const PipelineAction& a, bool wait, double t0) {
  trace_.spans.push_back({a, step.index, wait, t0, trace_now(), thread_cpu_s() - step.cpu0});
}

// Posts the receives of a channel ahead, in list order, up to kReceiveLookahead.
void Pipeline::post_receives(Step& step, bool grad) {
  Step::Channel& ch = grad ? step.grad : step.act;
  const int last = num_chunks() - 1;
  comm::Communicator& link = ctx_->comm(options_.axis);
  while (ch.posted.size() < kReceiveLookahead && ch.scan < step.actions.size()) {
    const PipelineAction& a = step.actions[ch.scan++];
    if (a.op != ch.op) continue;
    // The activation chunk c-1 sends into chunk c, or the cotangent of chunk c's output.
    const Shape shape = module_->activation_shape(step.shape_scope, grad ? a.chunk : a.chunk - 1,
                                                  last + 1, step.micro_batch(a.microbatch));
    Step::Posted r{a, Tensor::empty(shape, DType::F32), {}};
    r.request = link.irecv(comm::buffer_of(r.buffer), schedule_.peer_of(a), ch.tag);
    ch.posted.push_back(std::move(r));
  }
}

// Waits for the receive `a` (posted ahead) and returns its buffer; a wait span.
Tensor Pipeline::receive(Step& step, const PipelineAction& a) {
  const bool grad = a.op == PipelineOp::RecvGrad;
  Step::Channel& ch = grad ? step.grad : step.act;
  post_receives(step, grad);
  DISTJAX_CHECK(!ch.posted.empty() && ch.posted.front().action == a, Error, "[Pipeline] stage ",
                stage_, ": receive ", describe(a, schedule_), " was not posted in order");
  Step::Posted r = std::move(ch.posted.front());
  ch.posted.pop_front();
  const double t0 = trace_now();
  step.cpu0 = thread_cpu_s();
  r.request.wait();
  record_span(step, a, /*wait=*/true, t0);
  post_receives(step, grad);
  r.buffer.set_varying_axes(step.act_mask);
  return r.buffer;
}

// Starts sending `t` to stage `to` and leaves it in flight; frees the sends done since.
void Pipeline::send(Step& step, const Tensor& t, int to, int tag) {
  Step::Sent x{t.detach(), {}};  // row-major storage: sent as is
  x.request = ctx_->comm(options_.axis).isend(comm::buffer_of(x.buffer), to, tag);
  step.sends.push_back(std::move(x));
  while (!step.sends.empty() && step.sends.front().request.test())
    step.sends.pop_front();  // completed: free the buffer
}

// The input of chunk a.chunk > 0: received from another stage, or left by the previous
// chunk's forward on this one.
Tensor Pipeline::forward_input(Step& step, const PipelineAction& a) {
  if (auto x = Step::take(step.received_act, {a.microbatch, a.chunk})) return *x;
  std::optional<Tensor> x = Step::take(step.local_act, {a.microbatch, a.chunk - 1});
  DISTJAX_CHECK(x.has_value(), Error, "[Pipeline] stage ", stage_, ": ", describe(a, schedule_),
                " has no input");
  return *x;
}

// F: the chunk's forward on its micro-batch, on the tape; the last chunk's loss and
// metrics go into the step's result, another chunk's output to the next chunk.
void Pipeline::run_forward(Step& step, const PipelineAction& a) {
  const double t0 = trace_now();
  step.cpu0 = thread_cpu_s();
  const int last = num_chunks() - 1;
  const train::Batch mb = step.micro_batch(a.microbatch);
  Step::Live rec;
  if (a.chunk > 0) rec.input = tensor::make_leaf(forward_input(step, a));
  const Key mb_key = step.key.fold_in(static_cast<std::uint64_t>(a.microbatch));
  const nn::Scope scope = chunk_scope(step.leaves, mb_key);
  train::Metrics metrics;
  {
    tensor::EnableGradGuard grad_on;
    // The objective is the mean over the m micro-batches: a loss a chunk adds on the way
    // (autodiff::add_loss) counts 1/m, as the last chunk's does (output_cotangent).
    const autodiff::ObjectiveScale per_microbatch(1.0 / schedule_.microbatches);
    if (a.chunk == last && step.loss_fn) {
      // The train step's loss function in place of the last chunk (module_loss()'s contract).
      train::Batch in = mb;
      if (a.chunk > 0) in.inputs = rec.input;
      auto [loss, m] = step.loss_fn(step.leaves, in, mb_key);
      rec.output = std::move(loss);
      metrics = std::move(m);
    } else {
      rec.output = module_->forward(scope, a.chunk, last + 1, rec.input, mb, metrics);
    }
  }
  if (a.chunk == last) {
    DISTJAX_CHECK(rec.output.numel() == 1, InvalidArgument, "[Pipeline] the last chunk (or the "
                  "loss function) must return a scalar loss, got ",
                  distjax::to_string(rec.output.shape()));
    const auto b = static_cast<double>(step.b);
    if (!metrics.contains("loss")) metrics.add("loss", rec.output, b, b);
    step.out.metrics.merge(metrics);
  } else {
    step.out.metrics.merge(metrics);  // what the chunk's layers report (MoE statistics)
    const Shape want = module_->activation_shape(scope, a.chunk, last + 1, mb);
    DISTJAX_CHECK(rec.output.shape() == want, ShardingError, "[Pipeline] chunk ", a.chunk,
                  " returned an activation of shape ", distjax::to_string(rec.output.shape()),
                  ", the module's activation_shape says ", distjax::to_string(want));
    if (schedule_.stage_of(a.chunk + 1) == stage_)
      step.local_act[{a.microbatch, a.chunk}] = rec.output.detach();
  }
  step.live.emplace(Step::Slot{a.microbatch, a.chunk}, std::move(rec));
  trace_.peak_in_flight = std::max(trace_.peak_in_flight, ++step.in_flight);
  record_span(step, a, /*wait=*/false, t0);
}

// The cotangent a backward starts from: 1/m on the loss (the loss is the mean over the m
// micro-batches), else the one received or left by the next chunk on this stage.
Tensor Pipeline::output_cotangent(Step& step, const PipelineAction& a) {
  const Step::Slot slot{a.microbatch, a.chunk};
  if (a.chunk == num_chunks() - 1)
    return Tensor::full(step.live.at(slot).output.shape(), 1.0 / schedule_.microbatches);
  if (auto g = Step::take(step.received_grad, slot)) return *g;
  std::optional<Tensor> g = Step::take(step.local_grad, slot);
  DISTJAX_CHECK(g.has_value(), Error, "[Pipeline] stage ", stage_, ": ", describe(a, schedule_),
                " has no output cotangent");
  return *g;
}

// B, or I (the weight products deferred to W): the cotangents of the chunk's input and,
// for B, of the parameters; the input's goes to the previous chunk (send_grad when it
// lives on another stage).
void Pipeline::run_backward(Step& step, const PipelineAction& a) {
  const double t0 = trace_now();
  step.cpu0 = thread_cpu_s();
  const Step::Slot slot{a.microbatch, a.chunk};
  const Tensor seed = output_cotangent(step, a);
  Step::Live& rec = step.live.at(slot);
  std::vector<Tensor> wrt;
  if (rec.input.defined()) wrt.push_back(rec.input);
  const std::size_t offset = wrt.size();
  wrt.insert(wrt.end(), step.leaf_list.begin(), step.leaf_list.end());
  std::vector<Tensor> g;
  {
    std::optional<tensor::WeightGradStoreGuard> defer;
    if (a.op == PipelineOp::BackwardInput) defer.emplace(&rec.deferred);
    // A rematerialised block run again here attaches its losses as its forward did.
    const autodiff::ObjectiveScale per_microbatch(1.0 / schedule_.microbatches);
    g = autodiff::grad_if_reached({rec.output}, {seed}, wrt);
  }
  tensor::NoGradGuard no_grad;
  for (std::size_t j = 0; j < step.leaf_list.size(); ++j)
    accumulate(step.acc, step.leaf_paths[j], g[offset + j]);
  if (a.chunk > 0) {
    Tensor gin = g[0].defined() ? g[0] : Tensor::zeros(rec.input.shape());
    const Step::Slot prev{a.microbatch, a.chunk - 1};
    if (schedule_.stage_of(a.chunk - 1) == stage_) step.local_grad[prev] = gin;
    else step.outgoing_grad[slot] = gin;
  }
  rec.input = Tensor();
  rec.output = Tensor();
  if (a.op == PipelineOp::Backward) {
    --step.in_flight;
    step.live.erase(slot);
  }
  record_span(step, a, /*wait=*/false, t0);
}

// W: the weight products I deferred; frees the micro-batch chunk.
void Pipeline::run_weight_backward(Step& step, const PipelineAction& a) {
  const double t0 = trace_now();
  step.cpu0 = thread_cpu_s();
  const Step::Slot slot{a.microbatch, a.chunk};
  tensor::NoGradGuard no_grad;
  for (auto& [node, g] : step.live.at(slot).deferred.run()) {
    auto it = step.path_of_node.find(node.get());
    DISTJAX_CHECK(it != step.path_of_node.end(), Error,
                  "[Pipeline] a deferred weight cotangent of an unknown leaf");
    accumulate(step.acc, it->second, g);
  }
  --step.in_flight;
  step.live.erase(slot);
  record_span(step, a, /*wait=*/false, t0);
}

// Waits for the sends still in flight; every parameter of the stage gets a gradient
// (zeros where no chunk used it); the stages without the loss report its metrics as zeros.
train::GradientResult Pipeline::finish_step(Step& step) {
  const double t0 = trace_now();
  step.cpu0 = thread_cpu_s();
  for (Step::Sent& x : step.sends)
    x.request.wait();
  if (!step.sends.empty()) record_span(step, {PipelineOp::SendActivation, 0, 0}, true, t0);
  step.sends.clear();
  trace_.end = trace_now();

  tensor::NoGradGuard no_grad;
  train::GradientResult out = std::move(step.out);
  for (const auto& [path, t] : step.marked) {
    Tensor g = step.acc.contains(path) ? step.acc.at(path) : Tensor::zeros(t.shape(), t.dtype());
    g.set_varying_axes(t.varying_axes());
    out.grads.set(path, g);
  }
  // Every stage reports every name (zeros for what it has not), so they merge over the
  // pipe axis.
  for (const std::string& name : module_->metric_names())
    out.metrics.add(name, 0.0, 0.0);
  return out;
}

train::Metrics Pipeline::evaluate(const TensorTree& params, const train::Batch& batch_in) {
  const int m = schedule_.microbatches, last = num_chunks() - 1;
  DISTJAX_CHECK(batch_in.size() % m == 0, InvalidArgument, "[Pipeline::evaluate] batch size ",
                batch_in.size(), " is not divisible by ", m, " micro-batches");
  const std::int64_t b = batch_in.size() / m;
  tensor::NoGradGuard no_grad;
  train::Batch batch = inner_ ? inner_->own_batch(batch_in) : batch_in;
  batch = vary_over_pipe(batch);
  const std::uint32_t act_mask = batch.inputs.varying_axes() |
                                 ctx_->axis_mask(module_->activation_axes()) | pipe_mask_;
  const TensorTree marked = stage_params(params);
  comm::Communicator& link = ctx_->comm(options_.axis);
  nn::Scope scope =
      nn::Scope::apply(&marked, /*train=*/false).on(*ctx_).with_precision(options_.precision);
  if (options_.fsdp) scope = scope.fully_sharded(*options_.fsdp);
  train::Metrics out;
  std::vector<comm::Request> sends;
  std::vector<Tensor> keep;  // send buffers until their sends complete
  for (int mb = 0; mb < m; ++mb) {
    const train::Batch slice = batch.slice(mb * b, (mb + 1) * b);
    Tensor x;  // output of the previous chunk when it ran here
    for (int c : chunks()) {
      if (c > 0 && schedule_.stage_of(c - 1) != stage_) {
        x = Tensor::empty(module_->activation_shape(scope, c - 1, last + 1, slice));
        link.irecv(comm::buffer_of(x), schedule_.stage_of(c - 1), kActivationTag).wait();
        x.set_varying_axes(act_mask);
      }
      train::Metrics metrics;
      Tensor y = module_->forward(scope, c, last + 1, x, slice, metrics);
      if (c == last && !metrics.contains("loss"))
        metrics.add("loss", y, static_cast<double>(b), static_cast<double>(b));
      out.merge(metrics);
      if (c != last && schedule_.stage_of(c + 1) != stage_) {
        keep.push_back(y);
        sends.push_back(link.isend(comm::buffer_of(y), schedule_.stage_of(c + 1), kActivationTag));
      }
      x = y;
    }
  }
  for (comm::Request& r : sends)
    r.wait();
  for (const std::string& name : module_->metric_names())
    out.add(name, 0.0, 0.0);
  return reduce_metrics(std::move(out));
}

TensorTree Pipeline::finalize_grads(TensorTree grads) {
  return inner_ ? inner_->finalize_grads(without_pipe(grads)) : without_pipe(grads);
}

TensorTree Pipeline::finalize_and_update(TensorTree grads, const optim::Optimizer& optimizer,
                                         TensorTree& params, TensorTree& opt_state,
                                         std::int64_t step) {
  if (!inner_) return train::Strategy::finalize_and_update(std::move(grads), optimizer, params, opt_state, step);
  return inner_->finalize_and_update(without_pipe(grads), optimizer, params, opt_state, step);
}

train::Metrics Pipeline::reduce_metrics(train::Metrics metrics) {
  // Only the last stage saw the losses: sum over the pipe axis, then the inner reduction.
  train::Metrics merged = sync_metrics(*ctx_, metrics, options_.axis);
  return inner_ ? inner_->reduce_metrics(std::move(merged)) : merged;
}

double Pipeline::grad_norm_squared(const TensorTree& grads) {
  const TensorTree g = without_pipe(grads);
  const double local = inner_ ? inner_->grad_norm_squared(g) : global_norm_squared(*ctx_, g);
  // Each stage holds different parameters: add the stages' squares.
  // Gathered and added in stage order: the same on every device and backend.
  comm::Communicator& c = ctx_->comm(options_.axis);
  std::vector<double> all(static_cast<std::size_t>(c.size()));
  c.all_gather(&local, all.data(), 1, DType::F64);
  double total = 0.0;
  for (double x : all)
    total += x;
  return total;
}

TensorTree Pipeline::init_opt_state(const optim::Optimizer& optimizer, const TensorTree& params) {
  return inner_ ? inner_->init_opt_state(optimizer, params) : optimizer.init(params);
}

void Pipeline::apply_update(const optim::Optimizer& optimizer, TensorTree& params,
                            const TensorTree& grads, TensorTree& opt_state, std::int64_t step) {
  if (inner_) inner_->apply_update(optimizer, params, grads, opt_state, step);
  else optimizer.update(params, grads, opt_state, step);
}

TensorTree Pipeline::opt_state_to_param_layout(const TensorTree& opt_state,
                                               const TensorTree& params) {
  return inner_ ? inner_->opt_state_to_param_layout(opt_state, params) : opt_state;
}

TensorTree Pipeline::opt_state_from_param_layout(const TensorTree& state,
                                                 const TensorTree& params) {
  return inner_ ? inner_->opt_state_from_param_layout(state, params) : state;
}

}  // namespace distjax::parallel
