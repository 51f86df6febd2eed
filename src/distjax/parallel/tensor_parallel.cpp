#include "distjax/parallel/tensor_parallel.hpp"

#include <cmath>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/nn/dense.hpp"
#include "distjax/parallel/data_parallel.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/parallel_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::parallel {

using mesh::P;

namespace {

bool one_device(spmd::DeviceContext* ctx, const mesh::Axes& axis) {
  return ctx == nullptr || ctx->axis_size(axis) == 1;
}

int norm_dim(const Tensor& x, int dim) {
  return dim < 0 ? dim + x.rank() : dim;
}

}  // namespace

// ------------------------------------------------------------ regions
// copy_to_tp_region / reduce_from_tp_region are conjugates: pvary (identity; psum
// backward) and psum (psum; identity backward). gather_from_sp_region /
// reduce_scatter_to_sp_region are the sequence-parallel pair: all_gather (reduce-scatter
// backward) and psum_scatter (all-gather backward).

Tensor copy_to_tp_region(spmd::DeviceContext* ctx, const Tensor& x, const mesh::Axes& axis) {
  if (ctx == nullptr) return x;
  return spmd::pvary(*ctx, x, axis);
}

Tensor reduce_from_tp_region(spmd::DeviceContext* ctx, const Tensor& x, const mesh::Axes& axis) {
  if (one_device(ctx, axis)) return x;
  return spmd::psum(*ctx, x, axis);
}

Tensor gather_from_sp_region(spmd::DeviceContext* ctx, const Tensor& x, const mesh::Axes& axis,
                             int dim) {
  if (one_device(ctx, axis)) return x;
  return spmd::all_gather(*ctx, x, axis, norm_dim(x, dim), /*tiled=*/true);
}

Tensor reduce_scatter_to_sp_region(spmd::DeviceContext* ctx, const Tensor& x,
                                   const mesh::Axes& axis, int dim) {
  if (one_device(ctx, axis)) return x;
  return spmd::psum_scatter(*ctx, x, axis, norm_dim(x, dim), /*tiled=*/true);
}

Tensor split_to_sp_region(spmd::DeviceContext* ctx, const Tensor& x, const mesh::Axes& axis,
                          int dim) {
  if (one_device(ctx, axis)) return x;
  const int d = norm_dim(x, dim);
  const int n = ctx->axis_size(axis);
  DISTJAX_CHECK(d >= 0 && d < x.rank() && x.size(d) % n == 0, ShardingError,
                "[split_to_sp_region] dimension ", dim, " of ", to_string(x.shape()),
                " is not divisible by ", axis.str(), "=", n);
  const std::int64_t s = x.size(d) / n;
  const std::int64_t i = ctx->axis_index(axis);
  // pvary first: the block differs per device, so the cotangents of the blocks must be
  // summed over the devices (each one fills its own block of the replicated x).
  return tensor::slice(spmd::pvary(*ctx, x, axis), d, i * s, (i + 1) * s);
}

// ------------------------------------------------------------ Megatron layers

Tensor ColumnParallelDense::operator()(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "ColumnParallelDense", "x");
  const Tensor xin = copy_to_tp_region(scope.context(), x, axis);
  return nn::Dense{.features = features,
                   .use_bias = use_bias,
                   .kernel_init = kernel_init,
                   .bias_init = bias_init,
                   .kernel_spec = P(std::nullopt, axis),
                   .bias_spec = P(axis),
                   .gelu = gelu,
                   .compute_dtype_output = compute_dtype_output}(scope, xin);
}

Tensor RowParallelDense::operator()(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "RowParallelDense", "x");
  Tensor partial = nn::Dense{.features = features,
                             .use_bias = false,
                             .kernel_init = kernel_init,
                             .kernel_spec = P(axis, std::nullopt)}(scope, x);
  Tensor y = sequence_parallel ? reduce_scatter_to_sp_region(scope.context(), partial, axis, 1)
                               : reduce_from_tp_region(scope.context(), partial, axis);
  if (!use_bias) return y;
  return tensor::add(y, scope.param("bias", {features}, bias_init));
}

// ------------------------------------------------------------ TPDense

Tensor TPDense::operator()(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "TPDense", "x");
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[TPDense] \"", scope.path(),
                "\" expects x of rank >= 1, got ", to_string(x.shape()));
  spmd::DeviceContext* ctx = scope.context();
  const nn::Initializer kinit =
      kernel_init_adjustment == 1.0 ? kernel_init : nn::scaled(kernel_init, kernel_init_adjustment);
  // Mode None is the plain layer. On one device (or an axis of size 1) the other modes
  // keep their parameters' specs and skip the communication (the toolkit forces "none").
  if (mode == TPMode::None) {
    return nn::Dense{
        .features = features, .use_bias = use_bias, .kernel_init = kinit, .bias_init = bias_init}(
        scope, x);
  }
  const int rank = x.rank();
  if (mode == TPMode::Gather) {
    const Tensor full = skip_communication || one_device(ctx, axis)
                            ? x
                            : spmd::all_gather(*ctx, x, axis, rank - 1, /*tiled=*/true);
    return nn::Dense{.features = features,
                     .use_bias = use_bias,
                     .kernel_init = kinit,
                     .bias_init = bias_init,
                     .kernel_spec = P(std::nullopt, axis),
                     .bias_spec = P(axis)}(scope, full);
  }
  // Scatter: the local rows of the kernel give a partial product of full width.
  Tensor partial = nn::Dense{.features = features,
                             .use_bias = false,
                             .kernel_init = kinit,
                             .kernel_spec = P(axis, std::nullopt)}(scope, x);
  if (skip_communication) return partial;
  Tensor y = one_device(ctx, axis)
                 ? partial
                 : spmd::psum_scatter(*ctx, partial, axis, rank - 1, /*tiled=*/true);
  if (!use_bias) return y;
  return tensor::add(y, scope.param("bias", {features}, bias_init, P(axis)));
}

// ------------------------------------------------------------ TPNorm

Tensor TPNorm::operator()(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "TPNorm", "x");
  DISTJAX_CHECK(x.rank() >= 1, InvalidArgument, "[TPNorm] \"", scope.path(),
                "\" expects x of rank >= 1, got ", to_string(x.shape()));
  spmd::DeviceContext* ctx = scope.context();
  const int n = scope.axis_size(axis);
  const std::int64_t c = x.size(-1) * n;  // global width
  const int last = x.rank() - 1;
  Tensor scale = scope.param("scale", {c}, nn::ones(), P(axis));
  if (n == 1) {
    if (kind == Kind::RMS) return tensor::rms_norm(x, scale, eps);
    return tensor::layer_norm(x, scale, scope.param("bias", {c}, nn::zeros(), P(axis)), eps);
  }
  const double inv_c = 1.0 / static_cast<double>(c);
  Tensor centred = x;
  if (kind == Kind::Layer) {
    Tensor mean = tensor::mul_scalar(
        spmd::psum(*ctx, tensor::sum(x, {last}, /*keepdims=*/true), axis), inv_c);
    centred = tensor::sub(x, mean);
  }
  Tensor ms = tensor::mul_scalar(
      spmd::psum(*ctx, tensor::sum(tensor::square(centred), {last}, /*keepdims=*/true), axis),
      inv_c);
  Tensor y = tensor::mul(tensor::mul(centred, tensor::rsqrt(tensor::add_scalar(ms, eps))), scale);
  if (kind == Kind::RMS) return y;
  return tensor::add(y, scope.param("bias", {c}, nn::zeros(), P(axis)));
}

// ------------------------------------------------------------ vocabulary parallelism

Tensor VocabParallelEmbedding::operator()(const nn::Scope& scope, const Tensor& ids,
                                          bool sequence_parallel) const {
  tensor::check_defined(ids, "VocabParallelEmbedding", "ids");
  DISTJAX_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64, InvalidArgument,
                "[VocabParallelEmbedding] \"", scope.path(), "\" expects i32 or i64 ids, got ",
                dtype_name(ids.dtype()));
  DISTJAX_CHECK(num_embeddings > 0 && features > 0, InvalidArgument, "[VocabParallelEmbedding] \"",
                scope.path(), "\" needs num_embeddings > 0 and features > 0");
  spmd::DeviceContext* ctx = scope.context();
  Tensor table =
      scope.param("embedding", {num_embeddings, features}, embedding_init, P(axis, std::nullopt));
  if (one_device(ctx, axis)) return tensor::embedding(table, ids);
  // Ids outside this device's rows look up row 0 and are zeroed, then the rows are
  // summed over the devices: exactly one device contributes each id.
  const std::int64_t rows = table.size(0);
  const std::int64_t start = rows * ctx->axis_index(axis);
  tensor::ShardIds local = tensor::shard_ids(ids, start, rows, num_embeddings);
  DISTJAX_CHECK(local.out_of_range.count == 0, InvalidArgument, "[VocabParallelEmbedding] \"",
                scope.path(), "\" id ", local.out_of_range.first, " is outside [0, ",
                num_embeddings, ")");
  Shape keep_shape = ids.shape();
  keep_shape.push_back(1);
  Tensor keep = local.keep.view(keep_shape);
  keep.set_varying_axes(table.varying_axes());
  Tensor rows_here = tensor::mul(tensor::embedding(table, local.local), keep);
  if (sequence_parallel) return reduce_scatter_to_sp_region(ctx, rows_here, axis, 1);
  return reduce_from_tp_region(ctx, rows_here, axis);
}

Tensor VocabParallelEmbedding::attend(const nn::Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "VocabParallelEmbedding::attend", "x");
  DISTJAX_CHECK(x.rank() >= 1 && x.size(-1) == features, InvalidArgument,
                "[VocabParallelEmbedding::attend] \"", scope.path(), "\" expects x (..., ",
                features, "), got ", to_string(x.shape()));
  Tensor table =
      scope.param("embedding", {num_embeddings, features}, embedding_init, P(axis, std::nullopt));
  // x is replicated along the axis and the table varies: the product enters the region
  // (its backward sums dx over the devices).
  const Tensor xin = copy_to_tp_region(scope.context(), x, axis);
  return nn::matmul(scope.precision(), xin, table, /*trans_a=*/false, /*trans_b=*/true);
}

Tensor vocab_parallel_cross_entropy(spmd::DeviceContext* ctx, const Tensor& logits,
                                    const Tensor& labels, const mesh::Axes& axis) {
  tensor::check_defined(logits, "vocab_parallel_cross_entropy", "logits");
  tensor::check_defined(labels, "vocab_parallel_cross_entropy", "labels");
  if (one_device(ctx, axis)) return tensor::cross_entropy(logits, labels);
  DISTJAX_CHECK(logits.dtype() == DType::F32 && logits.rank() >= 1, InvalidArgument,
                "[vocab_parallel_cross_entropy] expected f32 logits (..., V/n), got ",
                logits.str(0));
  DISTJAX_CHECK(labels.dtype() == DType::I32 || labels.dtype() == DType::I64, InvalidArgument,
                "[vocab_parallel_cross_entropy] expected i32/i64 labels, got ",
                dtype_name(labels.dtype()));
  Shape lead = logits.shape();
  lead.pop_back();
  DISTJAX_CHECK(labels.shape() == lead, InvalidArgument, "[vocab_parallel_cross_entropy] labels ",
                to_string(labels.shape()), " do not match logits ", to_string(logits.shape()));
  const int last = logits.rank() - 1;
  const std::int64_t v_local = logits.size(-1);
  const std::int64_t vocab = v_local * ctx->axis_size(axis);
  const std::int64_t start = v_local * ctx->axis_index(axis);
  // The max only keeps exp() in range: it cancels in the loss, so it carries no gradient.
  Tensor m = spmd::pmax(*ctx, tensor::max(logits, {last}, /*keepdims=*/true).detach(), axis);
  Tensor shifted = tensor::sub(logits, m.detach());
  Tensor sum_exp = spmd::psum(*ctx, tensor::sum(tensor::exp(shifted), {last}), axis);
  // The label's logit: this device holds it for the labels in its block.
  tensor::ShardOneHot hot = tensor::shard_one_hot(labels, start, v_local, vocab);
  DISTJAX_CHECK(hot.out_of_range.count == 0, InvalidArgument,
                "[vocab_parallel_cross_entropy] label ", hot.out_of_range.first, " is outside [0, ",
                vocab, ")");
  Tensor onehot = hot.one_hot;
  onehot.set_varying_axes(logits.varying_axes());
  Tensor target = spmd::psum(*ctx, tensor::sum(tensor::mul(shifted, onehot), {last}), axis);
  return tensor::sub(tensor::log(sum_exp), target);
}

// ------------------------------------------------------------ the strategy

TensorParallel::TensorParallel(spmd::DeviceContext& ctx, mesh::Axes axes)
    : ctx_(&ctx), axes_(std::move(axes)) {
  ctx.mesh().check_axes(axes_, "TensorParallel");
  traits_.name = "tensor(" + axes_.str() + "=" + std::to_string(ctx.axis_size(axes_)) + ")";
  traits_.local_grad_norm = false;
  traits_.memory = &ctx.memory();
}

double TensorParallel::grad_norm_squared(const TensorTree& grads) {
  return global_norm_squared(*ctx_, grads);
}

}  // namespace distjax::parallel
