#include "distjax/parallel/zero.hpp"

#include <algorithm>

#include "distjax/core/error.hpp"
#include "distjax/optim/clip.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/inplace_ops.hpp"

namespace distjax::parallel {

using tensor::Tensor;

namespace {

// Chunk size of a leaf of `numel` elements split n ways (the last chunk zero-padded).
std::int64_t chunk_size(std::int64_t numel, int n) {
  return (numel + n - 1) / n;
}

// Elements of chunk `b` of a leaf that exist (the rest is padding).
std::int64_t chunk_extent(std::int64_t numel, std::int64_t k, int b) {
  return std::clamp<std::int64_t>(numel - b * k, 0, k);
}

// Chunk r of leaf `t` (flat; `have` elements) into the start of `c`.
void copy_chunk(const Tensor& c, const Tensor& t, std::int64_t k, int r, std::int64_t have) {
  if (have == 0) return;
  const Tensor flat = t.view({t.numel()});
  tensor::copy_into(c.view_rows(0, have), flat.view_rows(r * k, r * k + have));
}

// Copies the n chunks (k elements each, the last ones short or empty) of a leaf of `numel`
// elements between the leaf, flat, and column `offset` of n rank-major blocks of `block`
// elements: into the blocks when to_blocks, else back into the leaf.
void copy_chunks(const Tensor& blocks, std::int64_t block, std::int64_t offset, const Tensor& leaf,
                 std::int64_t k, bool to_blocks) {
  const std::int64_t numel = leaf.numel();
  if (k == 0) return;
  const std::int64_t full = numel / k, rest = numel - full * k;
  const tensor::Rows in_blocks{offset, block}, in_leaf{0, k};
  const tensor::Rows rest_in_blocks{full * block + offset, 0}, rest_in_leaf{full * k, 0};
  if (to_blocks) {
    tensor::copy_rows_into(blocks, in_blocks, leaf, in_leaf, full, k);
    if (rest > 0) tensor::copy_rows_into(blocks, rest_in_blocks, leaf, rest_in_leaf, 1, rest);
  } else {
    tensor::copy_rows_into(leaf, in_leaf, blocks, in_blocks, full, k);
    if (rest > 0) tensor::copy_rows_into(leaf, rest_in_leaf, blocks, rest_in_blocks, 1, rest);
  }
}

// The split leaves in buckets: path order, each bucket at most `max_elems` elements per
// device (its chunks), at least one leaf.
struct Bucket {
  std::vector<std::string> paths;
  std::vector<std::int64_t> offsets;  // of each leaf's chunk within the bucket's block
  std::int64_t block = 0;             // elements of one device's block (sum of chunks)
};

std::vector<Bucket> make_buckets(const std::vector<std::pair<std::string, std::int64_t>>& leaves,
                                 int n, std::int64_t max_elems) {
  std::vector<Bucket> out;
  for (const auto& [path, numel] : leaves) {
    const std::int64_t k = chunk_size(numel, n);
    if (out.empty() || (out.back().block > 0 && out.back().block + k > max_elems))
      out.emplace_back();
    out.back().paths.push_back(path);
    out.back().offsets.push_back(out.back().block);
    out.back().block += k;
  }
  return out;
}

}  // namespace

ZeroDataParallel::ZeroDataParallel(spmd::DeviceContext& ctx, int stage, mesh::Axes axes,
                                   const ParamSpecs* specs, DataParallelOptions options)
    : ctx_(&ctx),
      stage_(stage),
      axes_(axes),
      specs_(specs),
      bucket_bytes_(options.bucket_bytes),
      dp_(ctx, axes, specs,
          {.bucket_bytes = options.bucket_bytes,
           .overlap = false,
           .expert = options.expert,
           .key_axes = options.key_axes}) {
  DISTJAX_CHECK(options.fully_sharded.names.empty(), InvalidArgument,
                "[ZeroDataParallel] ZeRO-", stage, " with fully sharded parameters over ",
                options.fully_sharded.str(), ": stage 3 is DataParallel's fully_sharded");
  DISTJAX_CHECK(stage == 1 || stage == 2, InvalidArgument,
                "[ZeroDataParallel] stage must be 1 or 2, got ", stage,
                " (stage 3 stores the parameters sharded: nn::Scope::fully_sharded, nn/scope.hpp)");
  traits_.data_parallel_size = dp_.data_parallel_size();
  traits_.name = "zero" + std::to_string(stage_) + "(" + axes_.str() + "=" +
                 std::to_string(traits_.data_parallel_size) + ")";
  if (stage_ == 2)
    traits_.problem_as_inner =
        "ZeRO-2 reduce-scatters inside its own forward_backward, which a pipeline replaces; "
        "use ZeRO-1, or ZeRO-3 through PipelineOptions::fsdp with DataParallel";
  traits_.local_grad_norm = false;
  traits_.memory = &ctx.memory();
}

mesh::Axes ZeroDataParallel::split_axes(const std::string& path, const Tensor& t) const {
  if (t.dtype() != DType::F32) return {};
  return mesh::Axes(axes_to_average(axes_, specs_, path));
}

std::vector<ZeroDataParallel::SplitGroup> ZeroDataParallel::split_groups(
    const TensorTree& tree) const {
  std::vector<SplitGroup> groups;
  for (const auto& [path, t] : tree) {
    const mesh::Axes axes = split_axes(path, t);
    if (axes.names.empty()) continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const SplitGroup& g) { return g.axes.names == axes.names; });
    if (it == groups.end()) it = groups.insert(groups.end(), SplitGroup{axes, {}});
    it->leaves.emplace_back(path, t.numel());
  }
  return groups;
}

TensorTree ZeroDataParallel::own_chunks(const TensorTree& params) const {
  TensorTree out;
  for (const auto& [path, p] : params) {
    const mesh::Axes axes = split_axes(path, p);
    if (axes.names.empty()) {
      out.set(path, p);
      continue;
    }
    const int n = ctx_->axis_size(axes), r = ctx_->axis_index(axes);
    const std::int64_t k = chunk_size(p.numel(), n), have = chunk_extent(p.numel(), k, r);
    Tensor c = Tensor::zeros({k}, DType::F32, p.device());
    copy_chunk(c, p, k, r, have);
    c.set_varying_axes(p.varying_axes() | ctx_->axis_mask(axes));
    out.set(path, c);
  }
  return out;
}

TensorTree ZeroDataParallel::scatter_grads(const TensorTree& grads, bool keep_full) {
  TensorTree out, rest;
  for (const auto& [path, g] : grads)
    if (split_axes(path, g).names.empty()) rest.set(path, g);
  for (const auto& [path, g] : sync_grads(*ctx_, rest, axes_, specs_, bucket_bytes_))
    out.set(path, g);
  for (const SplitGroup& group : split_groups(grads)) {
    comm::Communicator& comm = ctx_->comm(group.axes);
    const int n = comm.size(), r = comm.rank();
    const std::uint32_t mask = ctx_->axis_mask(group.axes);
    const auto max_elems = static_cast<std::int64_t>(bucket_bytes_ / sizeof(float)) / n;
    for (const Bucket& b : make_buckets(group.leaves, n, std::max<std::int64_t>(1, max_elems))) {
      // Rank-major: block j holds every leaf's chunk j, so the reduce-scatter leaves each
      // device the averaged chunks it owns.
      const Device device = grads.at(b.paths[0]).device();
      Tensor send = Tensor::zeros({n * b.block}, DType::F32, device);
      for (std::size_t i = 0; i < b.paths.size(); ++i) {
        const Tensor& g = grads.at(b.paths[i]);
        copy_chunks(send, b.block, b.offsets[i], g, chunk_size(g.numel(), n), /*to_blocks=*/true);
      }
      Tensor recv = Tensor::empty({b.block}, DType::F32, device);
      comm.reduce_scatter(comm::buffer_of(send), comm::buffer_of(recv), comm::ReduceOp::Mean);
      // Stage 1 keeps the full-size gradient buffer (its chunk written back in place);
      // stage 2 keeps only the chunks.
      Tensor held = recv;
      std::int64_t base = 0;
      if (keep_full) {
        tensor::copy_into(send.view_rows(r * b.block, (r + 1) * b.block), recv);
        held = send;
        base = r * b.block;
      }
      for (std::size_t i = 0; i < b.paths.size(); ++i) {
        const Tensor& g = grads.at(b.paths[i]);
        const std::int64_t k = chunk_size(g.numel(), n);
        Tensor c = held.view_rows(base + b.offsets[i], base + b.offsets[i] + k);
        c.set_varying_axes(g.varying_axes() | mask);
        out.set(b.paths[i], c);
      }
    }
  }
  return out;
}

train::GradientResult ZeroDataParallel::forward_backward(const train::LossFn& loss_fn,
                                                         const TensorTree& params,
                                                         const train::Batch& batch, const Key& key,
                                                         int num_minibatches) {
  if (stage_ == 1) return dp_.forward_backward(loss_fn, params, batch, key, num_minibatches);
  // Stage 2: each minibatch's gradient is reduce-scattered at once and only the chunks
  // are accumulated (the same keys and averaging as train::accumulate_gradients).
  DISTJAX_CHECK(num_minibatches > 0 && batch.size() % num_minibatches == 0, InvalidArgument,
                "[ZeroDataParallel] batch of ", batch.size(),
                " examples is not divisible into num_minibatches=", num_minibatches);
  const std::int64_t mb = batch.size() / num_minibatches;
  train::GradientResult out;
  for (int i = 0; i < num_minibatches; ++i) {
    const Key k = num_minibatches == 1 ? key : key.fold_in(static_cast<std::uint64_t>(i));
    train::GradientResult part =
        dp_.forward_backward(loss_fn, params, batch.slice(i * mb, (i + 1) * mb), k, 1);
    TensorTree chunks = scatter_grads(part.grads, /*keep_full=*/false);
    tensor::NoGradGuard no_grad;
    if (num_minibatches == 1) {
      // no accumulation
    } else if (i == 0) {
      out.grads = chunks.map([](const Tensor& t) { return t.clone(); });
    } else {
      for (auto& [path, acc] : out.grads)
        tensor::add_into(acc, chunks.at(path));
    }
    if (num_minibatches == 1) out.grads = chunks;
    out.metrics.merge(part.metrics);
  }
  if (num_minibatches > 1) optim::scale_in_place(out.grads, 1.0 / num_minibatches);
  return out;
}

TensorTree ZeroDataParallel::finalize_grads(TensorTree grads) {
  // Stage 2 reduce-scattered each minibatch in forward_backward already.
  return stage_ == 1 ? scatter_grads(grads, /*keep_full=*/true) : grads;
}

double ZeroDataParallel::grad_norm_squared(const TensorTree& grads) {
  return global_norm_squared(*ctx_, grads);
}

TensorTree ZeroDataParallel::init_opt_state(const optim::Optimizer& optimizer,
                                            const TensorTree& params) {
  return optimizer.init(own_chunks(params));
}

void ZeroDataParallel::apply_update(const optim::Optimizer& optimizer, TensorTree& params,
                                    const TensorTree& grads, TensorTree& opt_state,
                                    std::int64_t step) {
  TensorTree chunks = own_chunks(params);
  optimizer.update(chunks, grads, opt_state, step);
  // All-gather the updated chunks over each group's axes and write every replica's
  // parameters in place.
  for (const SplitGroup& group : split_groups(params)) {
    comm::Communicator& comm = ctx_->comm(group.axes);
    const int n = comm.size();
    const auto max_elems = static_cast<std::int64_t>(bucket_bytes_ / sizeof(float)) / n;
    for (const Bucket& b : make_buckets(group.leaves, n, std::max<std::int64_t>(1, max_elems))) {
      const Device device = params.at(b.paths[0]).device();
      Tensor send = Tensor::empty({b.block}, DType::F32, device);
      for (std::size_t i = 0; i < b.paths.size(); ++i) {
        const Tensor& c = chunks.at(b.paths[i]);
        tensor::copy_into(send.view_rows(b.offsets[i], b.offsets[i] + c.numel()), c);
      }
      Tensor recv = Tensor::empty({n * b.block}, DType::F32, device);
      comm.all_gather(comm::buffer_of(send), comm::buffer_of(recv));
      for (std::size_t i = 0; i < b.paths.size(); ++i) {
        const Tensor& p = params.at(b.paths[i]);
        copy_chunks(recv, b.block, b.offsets[i], p, chunk_size(p.numel(), n),
                    /*to_blocks=*/false);
      }
    }
  }
}

std::pair<const Tensor*, mesh::Axes> ZeroDataParallel::split_param_of(
    const std::string& state_path, const TensorTree& params) const {
  const auto slash = state_path.find('/');
  if (slash == std::string::npos) return {nullptr, {}};
  const std::string path = state_path.substr(slash + 1);
  if (!params.contains(path)) return {nullptr, {}};
  const Tensor& p = params.at(path);
  mesh::Axes axes = split_axes(path, p);
  if (axes.names.empty()) return {nullptr, {}};
  return {&p, std::move(axes)};
}

TensorTree ZeroDataParallel::opt_state_to_param_layout(const TensorTree& opt_state,
                                                       const TensorTree& params) {
  TensorTree out;
  for (const auto& [path, s] : opt_state) {
    const auto [p, axes] = split_param_of(path, params);
    if (p == nullptr) {
      out.set(path, s);
      continue;
    }
    comm::Communicator& comm = ctx_->comm(axes);
    const int n = comm.size();
    const std::int64_t k = chunk_size(p->numel(), n);
    DISTJAX_CHECK(s.dtype() == DType::F32 && s.numel() == k, InvalidArgument,
                  "[ZeroDataParallel] optimizer state \"", path, "\" has ", s.numel(),
                  " elements; expected this device's chunk of ", k);
    Tensor all = Tensor::empty({n * k}, DType::F32, s.device());
    comm.all_gather(comm::buffer_of(s), comm::buffer_of(all));
    Tensor whole = Tensor::empty(p->shape(), DType::F32, s.device());
    tensor::copy_into(whole, all.view_rows(0, whole.numel()));
    whole.set_varying_axes(p->varying_axes());
    out.set(path, whole);
  }
  return out;
}

TensorTree ZeroDataParallel::opt_state_from_param_layout(const TensorTree& state,
                                                         const TensorTree& params) {
  TensorTree out;
  for (const auto& [path, s] : state) {
    const auto [p, axes] = split_param_of(path, params);
    if (p == nullptr) {
      out.set(path, s);
      continue;
    }
    DISTJAX_CHECK(s.shape() == p->shape(), InvalidArgument, "[ZeroDataParallel] optimizer state \"",
                  path, "\" has shape ", to_string(s.shape()), "; expected its parameter's ",
                  to_string(p->shape()));
    const int n = ctx_->axis_size(axes), r = ctx_->axis_index(axes);
    const std::int64_t k = chunk_size(s.numel(), n), have = chunk_extent(s.numel(), k, r);
    Tensor c = Tensor::zeros({k}, DType::F32, s.device());
    copy_chunk(c, s, k, r, have);
    c.set_varying_axes(s.varying_axes() | ctx_->axis_mask(axes));
    out.set(path, c);
  }
  return out;
}

}  // namespace distjax::parallel
