#include "distjax/parallel/pipeline.hpp"

#include "distjax/parallel/detail/pipeline_ops.hpp"

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
#include "distjax/parallel/zero.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/tensor/grad_node.hpp"

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
  Tensor a = acc.at(path);
  float* __restrict pa = a.data<float>();
  const float* __restrict pb = g.data<float>();
  const std::int64_t n = a.numel();
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    pa[i] += pb[i];
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
                   Strategy* inner)
    : ctx_(&ctx), module_(&module), options_(options), inner_(inner) {
  const int p = ctx.axis_size(options_.axis);
  stage_ = ctx.axis_index(options_.axis);
  pipe_mask_ = ctx.axis_mask(options_.axis);
  if (auto* zero = dynamic_cast<ZeroDataParallel*>(inner))
    DISTJAX_CHECK(zero->stage() == 1, ConfigError, "[Pipeline] ZeRO-", zero->stage(),
                  " reduce-scatters inside its own forward_backward, which a pipeline replaces; "
                  "use ZeRO-1, or ZeRO-3 through PipelineOptions::fsdp with DataParallel");
  schedule_ = make_schedule(options_.schedule, p, options_.microbatches, options_.virtual_stages,
                            options_.costs);
  report_ = check_schedule(schedule_);  // proven before anything runs
}

std::string Pipeline::name() const {
  std::ostringstream os;
  os << "pipe(" << to_string(schedule_.kind) << ", " << options_.axis.str() << "="
     << schedule_.stages << ", m=" << schedule_.microbatches;
  if (schedule_.virtual_stages > 1) os << ", v=" << schedule_.virtual_stages;
  os << ")";
  if (inner_) os << " x " << inner_->name();
  return os.str();
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

train::GradientResult Pipeline::forward_backward(const train::LossFn&, const TensorTree& params,
                                                 const train::Batch& batch, const Key& key,
                                                 int num_minibatches) {
  DISTJAX_CHECK(num_minibatches >= 1 && batch.size() % num_minibatches == 0, InvalidArgument,
                "[Pipeline] batch size ", batch.size(), " is not divisible by num_minibatches ",
                num_minibatches);
  if (num_minibatches == 1) return run_schedule(params, batch, key);
  // Gradient accumulation around the pipeline: one schedule per minibatch, averaged.
  const std::int64_t n = batch.size() / num_minibatches;
  train::GradientResult out;
  for (int i = 0; i < num_minibatches; ++i) {
    train::GradientResult r = run_schedule(params, batch.slice(i * n, (i + 1) * n),
                                           key.fold_in(static_cast<std::uint64_t>(i)));
    out.loss += r.loss / num_minibatches;
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

train::GradientResult Pipeline::run_schedule(const TensorTree& params, const train::Batch& batch_in,
                                             const Key& key) {
  const PipelineSchedule& s = schedule_;
  const int m = s.microbatches, last = s.num_chunks() - 1;
  DISTJAX_CHECK(batch_in.size() % m == 0, InvalidArgument, "[Pipeline] local batch size ",
                batch_in.size(), " is not divisible by ", m,
                " micro-batches; choose a batch that is a multiple of it");
  const std::int64_t b = batch_in.size() / m;
  train::Batch batch = inner_ ? inner_->own_batch(batch_in) : batch_in;
  batch.inputs.set_varying_axes(batch.inputs.varying_axes() | pipe_mask_);
  batch.labels.set_varying_axes(batch.labels.varying_axes() | pipe_mask_);
  const std::uint32_t act_mask = batch.inputs.varying_axes() |
                                 ctx_->axis_mask(module_->activation_axes()) | pipe_mask_;

  const TensorTree marked = stage_params(params);
  const TensorTree leaves = autodiff::detail::make_leaves(marked);
  std::vector<Tensor> leaf_list;
  std::vector<std::string> leaf_paths;
  std::map<const tensor::Node*, std::string> path_of_node;
  for (const auto& [path, t] : leaves) {
    if (!t.requires_grad()) continue;
    leaf_list.push_back(t);
    leaf_paths.push_back(path);
    path_of_node[t.grad_node().get()] = path;
  }

  comm::Communicator& link = ctx_->comm(options_.axis);
  const nn::Scope shape_scope = nn::Scope::apply(&leaves, /*train=*/true).on(*ctx_);

  // Receives, posted ahead in list order per channel (a channel is FIFO).
  struct Posted {
    PipelineAction action;
    Tensor buffer;
    comm::Request request;
  };
  const std::vector<PipelineAction>& actions = s.actions[stage_];
  std::deque<Posted> posted_act, posted_grad;
  std::size_t next_act = 0, next_grad = 0;  // next list index to scan for a receive
  auto post = [&](std::deque<Posted>& q, std::size_t& scan, PipelineOp op) {
    while (q.size() < kReceiveLookahead && scan < actions.size()) {
      const PipelineAction& a = actions[scan++];
      if (a.op != op) continue;
      const bool grad = op == PipelineOp::RecvGrad;
      // The activation chunk c-1 sends into chunk c, or the cotangent of chunk c's output.
      const train::Batch mb = batch.slice(a.microbatch * b, (a.microbatch + 1) * b);
      const Shape shape =
          module_->activation_shape(shape_scope, grad ? a.chunk : a.chunk - 1, last + 1, mb);
      Posted r{a, Tensor::empty(shape, DType::F32), {}};
      r.request = link.irecv(r.buffer.raw_data(), r.buffer.numel(), DType::F32,
                             detail::peer_of(a, s), grad ? kGradTag : kActivationTag);
      q.push_back(std::move(r));
    }
  };
  struct Sent {
    Tensor buffer;
    comm::Request request;
  };
  std::deque<Sent> sends;
  auto send = [&](const Tensor& t, int to, int tag) {
    Sent x{t.detach(), {}};  // row-major storage: sent as is
    x.request = link.isend(x.buffer.raw_data(), x.buffer.numel(), DType::F32, to, tag);
    sends.push_back(std::move(x));
    while (!sends.empty() && sends.front().request.test())
      sends.pop_front();  // completed: free the buffer
  };

  // A forwarded micro-batch chunk, held until its backward.
  struct Live {
    Tensor input;   // leaf of the received activation (undefined for chunk 0)
    Tensor output;  // activation passed on, or the loss
    tensor::WeightGradStore deferred;
  };
  std::map<std::pair<int, int>, Live> live;
  std::map<std::pair<int, int>, Tensor> received_act, received_grad;  // keyed by own chunk
  std::map<std::pair<int, int>, Tensor> local_act, local_grad;  // neighbour on this stage
  TensorTree acc;
  train::GradientResult out;
  int in_flight = 0;
  trace_ = PipelineTrace{};
  trace_.stage = stage_;
  trace_.start = now_s();

  std::size_t index = 0;  // of the action running
  double cpu0 = 0.0;
  auto span = [&](const PipelineAction& a, bool wait, double t0) {
    trace_.spans.push_back({a, index, wait, t0, now_s(), thread_cpu_s() - cpu0});
  };
  auto receive = [&](std::deque<Posted>& q, std::size_t& scan, PipelineOp op,
                     const PipelineAction& a) -> Tensor {
    post(q, scan, op);
    DISTJAX_CHECK(!q.empty() && q.front().action == a, Error, "[Pipeline] stage ", stage_,
                  ": receive ", describe(a, s), " was not posted in order");
    Posted r = std::move(q.front());
    q.pop_front();
    const double t0 = now_s();
    cpu0 = thread_cpu_s();
    r.request.wait();
    span(a, true, t0);
    post(q, scan, op);
    r.buffer.set_varying_axes(act_mask);
    return r.buffer;
  };
  auto add_param_grads = [&](const std::vector<Tensor>& g, std::size_t offset) {
    for (std::size_t j = 0; j < leaf_list.size(); ++j)
      accumulate(acc, leaf_paths[j], g[offset + j]);
  };

  post(posted_act, next_act, PipelineOp::RecvActivation);
  post(posted_grad, next_grad, PipelineOp::RecvGrad);
  for (; index < actions.size(); ++index) {
    const PipelineAction& a = actions[index];
    const std::pair<int, int> key_mc{a.microbatch, a.chunk};
    const double t0 = now_s();
    cpu0 = thread_cpu_s();
    switch (a.op) {
      case PipelineOp::RecvActivation:
        received_act[key_mc] = receive(posted_act, next_act, PipelineOp::RecvActivation, a);
        break;
      case PipelineOp::RecvGrad:
        received_grad[key_mc] = receive(posted_grad, next_grad, PipelineOp::RecvGrad, a);
        break;
      case PipelineOp::SendActivation:
        send(live.at(key_mc).output, s.stage_of(a.chunk + 1), kActivationTag);
        break;
      case PipelineOp::SendGrad:
        break;  // sent by the backward that produced it (below), at once
      case PipelineOp::Forward: {
        const train::Batch mb = batch.slice(a.microbatch * b, (a.microbatch + 1) * b);
        Live rec;
        if (a.chunk > 0) {
          Tensor x;
          if (auto it = received_act.find(key_mc); it != received_act.end()) {
            x = it->second;
            received_act.erase(it);
          } else {
            auto jt = local_act.find({a.microbatch, a.chunk - 1});
            DISTJAX_CHECK(jt != local_act.end(), Error, "[Pipeline] stage ", stage_, ": ",
                          describe(a, s), " has no input");
            x = jt->second;
            local_act.erase(jt);
          }
          rec.input = tensor::make_leaf(x);
        }
        const Key mb_key = key.fold_in(static_cast<std::uint64_t>(a.microbatch));
        nn::Scope scope = nn::Scope::apply(&leaves, /*train=*/true, mb_key)
                              .on(*ctx_)
                              .with_precision(options_.precision);
        if (options_.fsdp) scope = scope.fully_sharded(*options_.fsdp);
        train::Metrics metrics;
        {
          tensor::EnableGradGuard grad_on;
          rec.output = module_->forward(scope, a.chunk, last + 1, rec.input, mb, metrics);
        }
        if (a.chunk == last) {
          DISTJAX_CHECK(rec.output.numel() == 1, InvalidArgument, "[Pipeline] the last chunk must "
                        "return a scalar loss, got ", distjax::to_string(rec.output.shape()));
          const double loss = rec.output.item<double>();
          if (!metrics.contains("loss"))
            metrics.add("loss", loss * static_cast<double>(b), static_cast<double>(b));
          out.metrics.merge(metrics);
          out.loss += loss / m;
        } else {
          const Shape want = module_->activation_shape(scope, a.chunk, last + 1, mb);
          DISTJAX_CHECK(rec.output.shape() == want, ShardingError, "[Pipeline] chunk ", a.chunk,
                        " returned an activation of shape ", distjax::to_string(rec.output.shape()),
                        ", the module's activation_shape says ", distjax::to_string(want));
          if (s.stage_of(a.chunk + 1) == stage_) local_act[key_mc] = rec.output.detach();
        }
        live.emplace(key_mc, std::move(rec));
        trace_.peak_in_flight = std::max(trace_.peak_in_flight, ++in_flight);
        span(a, false, t0);
        break;
      }
      case PipelineOp::Backward:
      case PipelineOp::BackwardInput: {
        Live& rec = live.at(key_mc);
        Tensor seed;
        if (a.chunk == last) {
          seed = Tensor::full(rec.output.shape(), 1.0 / m);  // the loss is the mean over m
        } else if (auto it = received_grad.find(key_mc); it != received_grad.end()) {
          seed = it->second;
          received_grad.erase(it);
        } else {
          auto jt = local_grad.find(key_mc);
          DISTJAX_CHECK(jt != local_grad.end(), Error, "[Pipeline] stage ", stage_, ": ",
                        describe(a, s), " has no output cotangent");
          seed = jt->second;
          local_grad.erase(jt);
        }
        std::vector<Tensor> wrt;
        if (rec.input.defined()) wrt.push_back(rec.input);
        const std::size_t offset = wrt.size();
        wrt.insert(wrt.end(), leaf_list.begin(), leaf_list.end());
        std::vector<Tensor> g;
        {
          std::optional<tensor::WeightGradStoreGuard> defer;
          if (a.op == PipelineOp::BackwardInput) defer.emplace(&rec.deferred);
          g = autodiff::grad_if_reached({rec.output}, {seed}, wrt);
        }
        tensor::NoGradGuard no_grad;
        add_param_grads(g, offset);
        if (a.chunk > 0) {
          Tensor gin = g[0].defined() ? g[0] : Tensor::zeros(rec.input.shape());
          if (s.stage_of(a.chunk - 1) == stage_) local_grad[{a.microbatch, a.chunk - 1}] = gin;
          else send(gin, s.stage_of(a.chunk - 1), kGradTag);
        }
        rec.input = Tensor();
        rec.output = Tensor();
        if (a.op == PipelineOp::Backward) {
          --in_flight;
          live.erase(key_mc);
        }
        span(a, false, t0);
        break;
      }
      case PipelineOp::BackwardWeight: {
        Live& rec = live.at(key_mc);
        tensor::NoGradGuard no_grad;
        for (auto& [node, g] : rec.deferred.run()) {
          auto it = path_of_node.find(node.get());
          DISTJAX_CHECK(it != path_of_node.end(), Error,
                        "[Pipeline] a deferred weight cotangent of an unknown leaf");
          accumulate(acc, it->second, g);
        }
        --in_flight;
        live.erase(key_mc);
        span(a, false, t0);
        break;
      }
    }
  }
  const double t0 = now_s();
  cpu0 = thread_cpu_s();
  for (Sent& x : sends)
    x.request.wait();
  if (!sends.empty()) span({PipelineOp::SendActivation, 0, 0}, true, t0);
  sends.clear();
  trace_.end = now_s();

  // Every parameter of the stage gets a gradient (zeros where no chunk used it).
  tensor::NoGradGuard no_grad;
  for (const auto& [path, t] : marked) {
    Tensor g = acc.contains(path) ? acc.at(path) : Tensor::zeros(t.shape(), t.dtype());
    g.set_varying_axes(t.varying_axes());
    out.grads.set(path, g);
  }
  if (!is_last_stage())
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
  batch.inputs.set_varying_axes(batch.inputs.varying_axes() | pipe_mask_);
  batch.labels.set_varying_axes(batch.labels.varying_axes() | pipe_mask_);
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
        link.irecv(x.raw_data(), x.numel(), DType::F32, schedule_.stage_of(c - 1), kActivationTag)
            .wait();
        x.set_varying_axes(act_mask);
      }
      train::Metrics metrics;
      Tensor y = module_->forward(scope, c, last + 1, x, slice, metrics);
      if (c == last) {
        if (!metrics.contains("loss"))
          metrics.add("loss", y.item<double>() * static_cast<double>(b), static_cast<double>(b));
        out.merge(metrics);
      } else if (schedule_.stage_of(c + 1) != stage_) {
        keep.push_back(y);
        sends.push_back(link.isend(y.raw_data(), y.numel(), DType::F32, schedule_.stage_of(c + 1),
                                   kActivationTag));
      }
      x = y;
    }
  }
  for (comm::Request& r : sends)
    r.wait();
  if (!is_last_stage())
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
  if (!inner_) return Strategy::finalize_and_update(std::move(grads), optimizer, params, opt_state, step);
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
