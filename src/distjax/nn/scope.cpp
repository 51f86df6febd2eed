#include "distjax/nn/scope.hpp"

#include <algorithm>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/mesh/named_sharding.hpp"
#include "distjax/nn/fsdp_gather.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/elementwise.hpp"

namespace distjax::nn {

Scope Scope::init(TensorTree* params, Key init_key, ParamSpecs* specs, bool train,
                  Key dropout_key) {
  DISTJAX_CHECK(params != nullptr, InvalidArgument, "[Scope::init] params tree is null");
  Scope s;
  s.out_ = params;
  s.in_ = params;
  s.specs_ = specs;
  s.mode_ = Mode::Init;
  s.init_key_ = init_key;
  s.train_ = train;
  s.dropout_key_ = dropout_key;
  return s;
}

Scope Scope::apply(const TensorTree* params, bool train, Key dropout_key) {
  DISTJAX_CHECK(params != nullptr, InvalidArgument, "[Scope::apply] params tree is null");
  Scope s;
  s.in_ = params;
  s.mode_ = Mode::Apply;
  s.train_ = train;
  s.dropout_key_ = dropout_key;
  return s;
}

Scope Scope::with_precision(Precision precision) const {
  DISTJAX_CHECK(precision.param_dtype == DType::F32, NotImplemented,
                "[Scope::with_precision] param_dtype must be f32 (master weights), got ",
                dtype_name(precision.param_dtype));
  DISTJAX_CHECK(is_floating(precision.compute_dtype), InvalidArgument,
                "[Scope::with_precision] compute_dtype must be f32, bf16 or f16, got ",
                dtype_name(precision.compute_dtype));
  Scope s = *this;
  s.precision_ = precision;
  return s;
}

Scope Scope::fully_sharded(FullySharded config) const {
  Scope s = *this;
  if (!config.modules.empty() &&
      std::find(config.modules.begin(), config.modules.end(), "*") == config.modules.end()) {
    DISTJAX_CHECK(config.prefetch == nullptr, NotImplemented,
                  "[Scope::fully_sharded] prefetching needs every module fully sharded "
                  "(modules empty or \"*\")");
    s.fsdp_modules_ = std::make_shared<const FullySharded>(std::move(config));
    return s;
  }
  if (config.prefetch != nullptr) config.prefetch->begin_pass();
  s.fsdp_ = std::make_shared<const FullySharded>(std::move(config));
  s.gathered_ = std::make_shared<std::map<std::string, Tensor>>();
  return s;
}

Scope Scope::module(std::string_view kind) const {
  if (!fsdp_modules_ || fsdp_) return *this;
  const auto& m = fsdp_modules_->modules;
  if (std::find(m.begin(), m.end(), kind) == m.end()) return *this;
  Scope s = *this;
  FullySharded c = *fsdp_modules_;
  c.modules.clear();
  s.fsdp_ = std::make_shared<const FullySharded>(std::move(c));
  s.gathered_ = std::make_shared<std::map<std::string, Tensor>>();
  return s;
}

Scope Scope::on(spmd::DeviceContext& ctx) const {
  Scope s = *this;
  s.ctx_ = &ctx;
  return s;
}

int Scope::axis_size(const mesh::Axes& axes) const {
  return ctx_ ? ctx_->axis_size(axes) : 1;
}

int Scope::axis_index(const mesh::Axes& axes) const {
  return ctx_ ? ctx_->axis_index(axes) : 0;
}

Scope Scope::sowing(Sown* sown) const {
  Scope s = *this;
  s.sown_ = sown;
  return s;
}

void Scope::sow_metric(const std::string& name, const Tensor& value) const {
  if (sown_) sown_->metrics[name].push_back(value);
}

void Scope::sow_loads(const std::string& path, const std::vector<double>& loads) const {
  if (!sown_) return;
  std::vector<double>& into = sown_->loads[path];
  if (into.empty()) into.assign(loads.size(), 0.0);
  for (std::size_t i = 0; i < loads.size() && i < into.size(); ++i) into[i] += loads[i];
}

Scope Scope::child(const std::string& name) const {
  DISTJAX_CHECK(!name.empty() && name.find('/') == std::string::npos, InvalidArgument,
                "[Scope::child] invalid scope name \"", name, "\" under \"", path_,
                "\" (must be non-empty, without '/')");
  Scope c = *this;
  c.path_ = full_path(name);
  c.dropout_key_ = dropout_key_.fold_in(std::string_view(name));
  return c;
}

std::string Scope::full_path(const std::string& name) const {
  return path_.empty() ? name : path_ + "/" + name;
}

std::string Scope::tree_path(const std::string& full) const {
  if (root_.empty()) return full;
  if (full == root_) return "";
  return full.substr(root_.size() + 1);
}

Tensor Scope::param(const std::string& name, const Shape& shape, const Initializer& init,
                    const mesh::PartitionSpec& spec) const {
  const std::string full = full_path(name);
  const std::string key = tree_path(full);
  DISTJAX_CHECK(spec.size() <= static_cast<int>(shape.size()), ShardingError,
                "[Scope::param] parameter \"", full, "\" of shape ", to_string(shape), " has spec ",
                spec.to_string(), " with more entries than dimensions");
  // Fully sharded: stored split further over the FSDP axis along `gather_dim`.
  int gather_dim = -1;
  mesh::PartitionSpec stored_spec = spec;
  if (ctx_ != nullptr && fsdp_ != nullptr) {
    mesh::validate_spec(ctx_->mesh(), spec, shape, "Scope::param", full);
    stored_spec = mesh::fully_sharded_spec(shape, spec, ctx_->mesh(), fsdp_->axis,
                                           fsdp_->min_weight_size, &gather_dim);
  }
  auto used = [&](Tensor t) {
    if (gather_dim < 0) return t;
    auto [it, fresh] = gathered_->try_emplace(full);
    if (fresh)
      it->second = fsdp_->prefetch != nullptr
                       ? fsdp_->prefetch->gather(*ctx_, full, t, fsdp_->axis, gather_dim)
                       : gather_fully_sharded(*ctx_, t, fsdp_->axis, gather_dim);
    return it->second;
  };
  // This device's block of the parameter, and the axes its shard varies over.
  Block block = Block::whole(shape);
  std::uint32_t varying = 0;
  if (ctx_ != nullptr && stored_spec.size() > 0) {
    mesh::validate_spec(ctx_->mesh(), stored_spec, shape, "Scope::param", full);
    const mesh::NamedSharding sharding(ctx_->mesh(), stored_spec);
    const auto range = sharding.shard_range(shape, ctx_->device());
    for (std::size_t d = 0; d < shape.size(); ++d) {
      block.start[d] = range[d].first;
      block.shape[d] = range[d].second - range[d].first;
    }
    varying = ctx_->axis_mask(stored_spec);
  }
  auto marked = [varying](Tensor t) {
    t.set_varying_axes(t.varying_axes() | varying);
    return t;
  };
  if (mode_ == Mode::Init) {
    if (out_->contains(key)) {
      // A layer applied twice in one scope shares its parameters (Flax semantics):
      // tied embeddings read the table once for the lookup and once for the output.
      const Tensor& t = out_->at(key);
      DISTJAX_CHECK(t.shape() == block.shape, InvalidArgument, "[Scope::param] parameter \"", full,
                    "\" was created with shape ", to_string(t.shape()),
                    " and is requested again with ", to_string(block.shape),
                    " (two layers share a scope name?)");
      return used(marked(t));
    }
    Tensor t = init(init_key_.fold_in(std::string_view(full)), shape, block);
    DISTJAX_CHECK(t.defined() && t.shape() == block.shape && t.dtype() == DType::F32,
                  InvalidArgument, "[Scope::param] initializer of \"", full, "\" returned ",
                  t.defined() ? t.str(0) : std::string("an undefined tensor"), ", expected f32 ",
                  to_string(block.shape));
    t = marked(t);
    out_->set(key, t);
    if (specs_ != nullptr && stored_spec.size() > 0) (*specs_)[full] = stored_spec;
    return used(t);
  }
  DISTJAX_CHECK(in_->contains(key), InvalidArgument, "[Scope::param] missing parameter \"", full,
                "\" (shape ", to_string(block.shape), "); the tree has ", in_->size(),
                " leaves. Was it made by init() of the same model and config?");
  const Tensor& t = in_->at(key);
  DISTJAX_CHECK(t.shape() == block.shape, InvalidArgument, "[Scope::param] parameter \"", full,
                "\" has shape ", to_string(t.shape()), ", expected ", to_string(block.shape),
                block.shape == shape ? std::string()
                                     : " (this device's shard of " + to_string(shape) +
                                           " split by " + stored_spec.to_string() + ")");
  return used(marked(t));
}

Scope Scope::rebased(const TensorTree* subtree) const {
  DISTJAX_CHECK(subtree != nullptr, InvalidArgument, "[Scope::rebased] subtree is null");
  Scope s = *this;
  s.out_ = nullptr;
  s.in_ = subtree;
  s.specs_ = nullptr;
  s.mode_ = Mode::Apply;
  s.root_ = path_;
  // The checkpoint's first run reports as its scope does; its recomputation (in the
  // backward pass, when the pass that sowed has returned) reports nothing.
  if (autodiff::recomputing()) s.sown_ = nullptr;
  // The re-run (a checkpoint's backward) gathers its parameters again, on the tape.
  if (fsdp_) s.gathered_ = std::make_shared<std::map<std::string, Tensor>>();
  return s;
}

TensorTree Scope::params() const {
  const std::string rel = tree_path(path_);
  return rel.empty() ? *in_ : in_->subtree(rel);
}

TensorTree init_parameters(Key key, ParamSpecs* specs, spmd::DeviceContext* ctx,
                           const FullySharded* fsdp,
                           const std::function<void(const Scope&)>& build) {
  TensorTree params;
  tensor::NoGradGuard no_grad;
  Scope scope = Scope::init(&params, key, specs);
  if (ctx != nullptr) scope = scope.on(*ctx);
  if (fsdp != nullptr) scope = scope.fully_sharded(*fsdp);
  build(scope);
  return params;
}

}  // namespace distjax::nn
