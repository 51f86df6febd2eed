#include "distjax/parallel/data_parallel.hpp"

#include <algorithm>
#include <set>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/parallel/sharding_rules.hpp"
#include "distjax/tensor/inplace_ops.hpp"
#include "distjax/tensor/parallel_ops.hpp"

namespace distjax::parallel {

using tensor::Tensor;

namespace {

// One all_reduce (mean) per bucket of at most `bucket_elems` over `comm`, leaves in the
// given order; results are views into the buckets.
void average_in_buckets(comm::Communicator& comm, std::uint32_t averaged_mask,
                        const std::vector<std::pair<std::string, Tensor>>& leaves,
                        std::int64_t bucket_elems, TensorTree& out) {
  std::vector<const std::pair<std::string, Tensor>*> pending;
  std::int64_t pending_elems = 0;
  auto flush = [&] {
    if (pending.empty()) return;
    // A fresh buffer: leaves may share storage (one cotangent feeding two inputs), so
    // nothing is averaged in place.
    Tensor bucket = Tensor::empty({pending_elems}, DType::F32, pending[0]->second.device());
    std::int64_t at = 0;
    for (const auto* leaf : pending) {
      tensor::copy_into(bucket.view_rows(at, at + leaf->second.numel()), leaf->second);
      at += leaf->second.numel();
    }
    comm.all_reduce(comm::buffer_of(bucket), comm::buffer_of(bucket), comm::ReduceOp::Mean);
    at = 0;
    for (const auto* leaf : pending) {
      const Tensor& g = leaf->second;
      Tensor r = bucket.view_rows(at, at + g.numel()).view(g.shape());
      r.set_varying_axes(g.varying_axes() & ~averaged_mask);
      out.set(leaf->first, r);
      at += g.numel();
    }
    pending.clear();
    pending_elems = 0;
  };
  for (const auto& leaf : leaves) {
    if (pending_elems > 0 && pending_elems + leaf.second.numel() > bucket_elems) flush();
    pending.push_back(&leaf);
    pending_elems += leaf.second.numel();
  }
  flush();
}

}  // namespace

std::vector<std::string> axes_to_average(const mesh::Axes& data_axes, const ParamSpecs* specs,
                                         const std::string& path) {
  const mesh::PartitionSpec* spec = nullptr;
  if (specs) {
    auto it = specs->find(path);
    if (it != specs->end()) spec = &it->second;
  }
  std::vector<std::string> out;
  for (const auto& a : data_axes.names)
    if (!spec || !spec->uses(a)) out.push_back(a);
  return out;
}

TensorTree sync_grads(spmd::DeviceContext& ctx, const TensorTree& grads,
                      const mesh::Axes& data_axes, const ParamSpecs* specs,
                      std::size_t bucket_bytes) {
  const std::int64_t bucket_elems =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(bucket_bytes / sizeof(float)));
  // Group the leaves by the axes they are averaged over (in path order within a group; the
  // groups in the order of their first leaf, the same on every device).
  std::vector<std::vector<std::string>> group_axes;
  std::vector<std::vector<std::pair<std::string, Tensor>>> groups;
  TensorTree out;
  for (const auto& [path, g] : grads) {
    DISTJAX_CHECK(g.dtype() == DType::F32, InvalidArgument, "[sync_grads] gradient \"", path,
                  "\" has dtype ", dtype_name(g.dtype()), "; expected f32");
    std::vector<std::string> axes = axes_to_average(data_axes, specs, path);
    if (axes.empty() || ctx.axis_size(mesh::Axes(axes)) == 1) {
      out.set(path, g);  // sharded over every data axis, or nothing to average
      continue;
    }
    std::size_t k = 0;
    while (k < group_axes.size() && group_axes[k] != axes)
      ++k;
    if (k == group_axes.size()) {
      group_axes.push_back(axes);
      groups.emplace_back();
    }
    groups[k].emplace_back(path, g);
  }
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const mesh::Axes axes(group_axes[k]);
    average_in_buckets(ctx.comm(axes), ctx.axis_mask(axes), groups[k], bucket_elems, out);
  }
  return out;
}

namespace {

// Sum over the group of `comm` of one double per device, added in device order: gathered,
// not all-reduced, since an MPI all-reduce may associate the sum otherwise (a tree), and
// the same bits on every backend are wanted.
double sum_in_device_order(comm::Communicator& comm, double mine) {
  std::vector<double> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(&mine, all.data(), 1, DType::F64);
  double s = 0;
  for (double v : all)
    s += v;
  return s;
}

}  // namespace

double global_norm_squared(spmd::DeviceContext& ctx, const TensorTree& grads) {
  // Local sums of squares, grouped by the axes the leaves vary over (in mask order). Each
  // in a fixed order (tensor::sum_of_squares_f64): the same bits on every device for the
  // same values, since a replicated leaf's sum is not exchanged and the devices must agree
  // on it by themselves.
  std::vector<Tensor> leaves;
  for (const auto& [path, g] : grads)
    if (g.dtype() == DType::F32) leaves.push_back(g);
  const std::vector<double> sums = tensor::sums_of_squares_f64(leaves);  // one wait for all
  std::map<std::uint32_t, double> by_mask;
  for (std::size_t i = 0; i < leaves.size(); ++i)
    by_mask[leaves[i].varying_axes()] += sums[i];
  double total = 0;
  for (const auto& [mask, s] : by_mask)
    total += mask == 0 ? s : sum_in_device_order(ctx.comm(ctx.axes_of(mask)), s);
  return total;
}

train::Metrics sync_metrics(spmd::DeviceContext& ctx, const train::Metrics& metrics,
                            const mesh::Axes& axes) {
  comm::Communicator& comm = ctx.comm(axes);
  const int n = comm.size();
  if (n == 1) return metrics;
  // Names: a hash of the sorted names must agree (min == max over the devices).
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  std::string names;
  for (const auto& [name, m] : metrics) {
    for (char c : name + '\0')
      h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    names += (names.empty() ? "" : ", ") + name;
  }
  std::int64_t hs[2] = {static_cast<std::int64_t>(h >> 1), -static_cast<std::int64_t>(h >> 1)};
  comm.all_reduce(hs, hs, 2, DType::I64, comm::ReduceOp::Max);
  DISTJAX_CHECK(hs[0] == -hs[1], InvalidArgument, "[sync_metrics] the devices along ", axes.str(),
                " report different metric names; device ", ctx.device(), " has: ", names);
  // (sum, count) pairs in name order, gathered and added in device order.
  std::vector<double> mine;
  for (const auto& [name, m] : metrics) {
    mine.push_back(m.sum);
    mine.push_back(m.count);
  }
  const std::int64_t k = static_cast<std::int64_t>(mine.size());
  std::vector<double> all(static_cast<std::size_t>(k * n));
  comm.all_gather(mine.data(), all.data(), k, DType::F64);
  train::Metrics out;
  std::size_t i = 0;
  for (const auto& [name, m] : metrics) {
    double sum = 0, count = 0;
    for (int r = 0; r < n; ++r) {
      sum += all[static_cast<std::size_t>(r * k) + i];
      count += all[static_cast<std::size_t>(r * k) + i + 1];
    }
    out.add(name, sum, count);
    i += 2;
  }
  return out;
}

// The gradient buckets of one step, filled in the order the backward pass finishes the
// gradients; a bucket's all-reduce (mean) starts as soon as it is full.
struct DataParallel::Overlap {
  struct Leaf {
    std::string path;
    Shape shape;
    std::uint32_t varying = 0;
    std::int64_t offset = 0;
  };
  struct Bucket {
    std::vector<std::string> axes;  // averaged over these
    Tensor buffer;                  // capacity >= filled
    std::int64_t filled = 0;
    std::vector<Leaf> leaves;
    comm::Request request;  // the all-reduce in flight once started
    bool started = false;
  };
  std::vector<Bucket> buckets;                           // in the order they were opened
  std::map<std::vector<std::string>, std::size_t> open;  // axes -> bucket being filled
  // Elements of the gradients of each group not in a bucket yet: a bucket is allocated
  // with min(bucket size, what is left), so small models get exact buffers.
  std::map<std::vector<std::string>, std::int64_t> left;
};

DataParallel::DataParallel(spmd::DeviceContext& ctx, mesh::Axes axes, const ParamSpecs* specs,
                           DataParallelOptions options)
    : ctx_(&ctx), axes_(std::move(axes)), specs_(specs), options_(std::move(options)) {
  ctx.mesh().check_axes(axes_, "DataParallel");
  for (const auto& a : options_.fully_sharded.names)
    DISTJAX_CHECK(std::find(axes_.names.begin(), axes_.names.end(), a) != axes_.names.end(),
                  InvalidArgument, "[DataParallel] fully sharded axis \"", a,
                  "\" is not one of its data axes ", axes_.str());
  traits_.data_parallel_size = ctx.axis_size(axes_);
  traits_.name = "data(" + axes_.str() + "=" + std::to_string(traits_.data_parallel_size) + ")";
  traits_.local_grad_norm = false;
  traits_.memory = &ctx.memory();
}

DataParallel::~DataParallel() = default;

// The specs are filled when the parameters are created, after the strategy: checked at the
// first step. Only the data axes are this strategy's to judge (the other axes may be a
// pipeline's or the activations'), so every other axis counts as used.
void DataParallel::lint_once() {
  if (linted_ || specs_ == nullptr) return;
  linted_ = true;
  ShardingPlan plan{.data_axes = axes_,
                    .fully_sharded_axes = options_.fully_sharded,
                    .expert_axes = options_.expert};
  for (const auto& a : ctx_->mesh().axis_names())
    if (std::find(axes_.names.begin(), axes_.names.end(), a) == axes_.names.end())
      plan.activation_axes.names.push_back(a);
  check_sharding(*specs_, ctx_->mesh(), plan);
}

Key DataParallel::step_key(const Key& key) {
  return ctx_->fold_rng_over_axis(key, options_.key_axes ? *options_.key_axes : axes_);
}

train::Batch DataParallel::own_batch(const train::Batch& batch) {
  // The batch is this device's slice: it varies along the data axes.
  const std::uint32_t data_mask = ctx_->axis_mask(axes_);
  return batch.map([&](Tensor t) {
    t.set_varying_axes(t.varying_axes() | data_mask);
    return t;
  });
}

TensorTree DataParallel::own_params(const TensorTree& params) {
  lint_once();
  // Each replica differentiates its own copy of the parameters along the data axes it is
  // not sharded on: no cotangent sum there (sync_grads averages afterwards, in buckets).
  TensorTree own;
  for (const auto& [path, p] : params) {
    Tensor t = p;  // same storage, own varying mark
    t.set_varying_axes(t.varying_axes() |
                       ctx_->axis_mask(mesh::Axes(axes_to_average(axes_, specs_, path))));
    own.set(path, t);
  }
  return own;
}

train::GradientResult DataParallel::forward_backward(const train::LossFn& loss_fn,
                                                     const TensorTree& params,
                                                     const train::Batch& batch, const Key& key,
                                                     int num_minibatches) {
  const train::Batch local = own_batch(batch);
  const TensorTree own = own_params(params);
  if (!options_.overlap)
    return train::accumulate_gradients(loss_fn, own, local, key, num_minibatches);

  const std::int64_t bucket_elems =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(options_.bucket_bytes / sizeof(float)));
  inflight_ = std::make_unique<Overlap>();
  Overlap& ov = *inflight_;
  for (const auto& [path, p] : params) {
    if (p.dtype() != DType::F32) continue;
    std::vector<std::string> axes = axes_to_average(axes_, specs_, path);
    if (!axes.empty() && ctx_->axis_size(mesh::Axes(axes)) > 1) ov.left[axes] += p.numel();
  }
  auto start = [&](Overlap::Bucket& b) {
    // Every device opens and fills its buckets in the same (ready) order, so the
    // collectives of a group match.
    comm::Communicator& c = ctx_->comm(mesh::Axes(b.axes));
    const comm::Buffer filled = comm::buffer_of(b.buffer.view_rows(0, b.filled));
    b.request = c.iall_reduce(filled, filled, comm::ReduceOp::Mean);
    b.started = true;
  };
  auto on_ready = [&](const std::string& path, const Tensor& g) {
    if (g.dtype() != DType::F32) return;
    std::vector<std::string> axes = axes_to_average(axes_, specs_, path);
    if (axes.empty() || ctx_->axis_size(mesh::Axes(axes)) == 1) return;
    auto it = ov.open.find(axes);
    if (it != ov.open.end()) {
      Overlap::Bucket& b = ov.buckets[it->second];
      if (b.filled + g.numel() > b.buffer.numel()) {
        start(b);
        ov.open.erase(it);
        it = ov.open.end();
      }
    }
    if (it == ov.open.end()) {
      Overlap::Bucket b;
      b.axes = axes;
      b.buffer = Tensor::empty({std::max(std::min(bucket_elems, ov.left[axes]), g.numel())},
                               DType::F32, g.device());
      it = ov.open.emplace(axes, ov.buckets.size()).first;
      ov.buckets.push_back(std::move(b));
    }
    Overlap::Bucket& b = ov.buckets[it->second];
    tensor::copy_into(b.buffer.view_rows(b.filled, b.filled + g.numel()), g);
    b.leaves.push_back({path, g.shape(), g.varying_axes(), b.filled});
    b.filled += g.numel();
    ov.left[axes] -= g.numel();
    if (b.filled == b.buffer.numel() || ov.left[axes] == 0) {  // full, or the group's last
      start(b);
      ov.open.erase(it);
    }
  };
  train::GradientResult r =
      train::accumulate_gradients(loss_fn, own, local, key, num_minibatches, on_ready);
  for (Overlap::Bucket& b : ov.buckets)  // the last, partly filled buckets
    if (!b.started) start(b);
  return r;
}

std::size_t DataParallel::started_buckets() const {
  if (!inflight_) return 0;
  return static_cast<std::size_t>(
      std::count_if(inflight_->buckets.begin(), inflight_->buckets.end(),
                    [](const Overlap::Bucket& b) { return b.started; }));
}

namespace {

// Waits for a bucket's all-reduce and sets its leaves in `out` as views into the bucket.
template <class Bucket>
void take_bucket(spmd::DeviceContext& ctx, Bucket& b, TensorTree& out) {
  b.request.wait();
  const std::uint32_t averaged = ctx.axis_mask(mesh::Axes(b.axes));
  for (const auto& leaf : b.leaves) {
    Tensor v = b.buffer.view_rows(leaf.offset, leaf.offset + numel(leaf.shape)).view(leaf.shape);
    v.set_varying_axes(leaf.varying & ~averaged);
    out.set(leaf.path, v);
  }
}

}  // namespace

TensorTree DataParallel::finalize_grads(TensorTree grads) {
  lint_once();
  if (!inflight_) return sync_grads(*ctx_, grads, axes_, specs_, options_.bucket_bytes);
  // The averaged gradients are views into the buckets; the others pass through.
  std::unique_ptr<Overlap> ov = std::move(inflight_);
  TensorTree out = grads;
  for (Overlap::Bucket& b : ov->buckets)
    take_bucket(*ctx_, b, out);
  return out;
}

TensorTree DataParallel::finalize_and_update(TensorTree grads, const optim::Optimizer& optimizer,
                                             TensorTree& params, TensorTree& opt_state,
                                             std::int64_t step) {
  if (!inflight_ || !optimizer.updates_per_leaf())
    return train::Strategy::finalize_and_update(std::move(grads), optimizer, params, opt_state,
                                                step);
  std::unique_ptr<Overlap> ov = std::move(inflight_);
  // Updates the parameters at `paths` with their gradients in `g` (shared storage: the
  // leaves of `params` change in place).
  auto update = [&](const std::vector<std::string>& paths, const TensorTree& g) {
    if (paths.empty()) return;
    TensorTree part, part_grads;
    for (const std::string& path : paths) {
      part.set(path, params.at(path));
      part_grads.set(path, g.at(path));
    }
    optimizer.update(part, part_grads, opt_state, step);
  };
  // The trainable leaves no bucket carries (sharded over every data axis) are final now;
  // integer leaves are not trained and may have no gradient.
  std::set<std::string> carried;
  for (const Overlap::Bucket& b : ov->buckets)
    for (const Overlap::Leaf& leaf : b.leaves)
      carried.insert(leaf.path);
  std::vector<std::string> rest;
  for (const auto& [path, p] : params)
    if (!carried.count(path) && is_floating(p.dtype())) rest.push_back(path);
  update(rest, grads);
  TensorTree out = grads;
  std::vector<std::string> paths;
  for (Overlap::Bucket& b : ov->buckets) {
    take_bucket(*ctx_, b, out);
    paths.clear();
    for (const Overlap::Leaf& leaf : b.leaves)
      paths.push_back(leaf.path);
    update(paths, out);
  }
  return out;
}

train::Metrics DataParallel::reduce_metrics(train::Metrics metrics) {
  return sync_metrics(*ctx_, metrics, axes_);
}

double DataParallel::grad_norm_squared(const TensorTree& grads) {
  return global_norm_squared(*ctx_, grads);
}

}  // namespace distjax::parallel
