#include "distjax/nn/scope.hpp"

#include "distjax/core/error.hpp"

namespace distjax::nn {

Scope Scope::init(TensorTree* params, Key init_key, Specs* specs, bool train, Key dropout_key) {
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
                    const AxisNames& axes) const {
  const std::string full = full_path(name);
  const std::string key = tree_path(full);
  if (mode_ == Mode::Init) {
    if (out_->contains(key)) {
      // A layer applied twice in one scope shares its parameters (Flax semantics):
      // tied embeddings read the table once for the lookup and once for the output.
      const Tensor& t = out_->at(key);
      DISTJAX_CHECK(t.shape() == shape, InvalidArgument, "[Scope::param] parameter \"", full,
                    "\" was created with shape ", to_string(t.shape()),
                    " and is requested again with ", to_string(shape),
                    " (two layers share a scope name?)");
      return t;
    }
    DISTJAX_CHECK(axes.empty() || axes.size() == shape.size(), InvalidArgument,
                  "[Scope::param] parameter \"", full, "\" of shape ", to_string(shape), " has ",
                  axes.size(), " axis names; expected none or one per dimension");
    Tensor t = init(init_key_.fold_in(std::string_view(full)), shape);
    DISTJAX_CHECK(t.defined() && t.shape() == shape && t.dtype() == DType::F32, InvalidArgument,
                  "[Scope::param] initializer of \"", full, "\" returned ",
                  t.defined() ? t.str(0) : std::string("an undefined tensor"), ", expected f32 ",
                  to_string(shape));
    out_->set(key, t);
    if (specs_ != nullptr && !axes.empty()) (*specs_)[full] = axes;
    return t;
  }
  DISTJAX_CHECK(in_->contains(key), InvalidArgument, "[Scope::param] missing parameter \"", full,
                "\" (shape ", to_string(shape), "); the tree has ", in_->size(),
                " leaves. Was it made by init() of the same model and config?");
  const Tensor& t = in_->at(key);
  DISTJAX_CHECK(t.shape() == shape, InvalidArgument, "[Scope::param] parameter \"", full,
                "\" has shape ", to_string(t.shape()), ", expected ", to_string(shape));
  return t;
}

Scope Scope::rebased(const TensorTree* subtree) const {
  DISTJAX_CHECK(subtree != nullptr, InvalidArgument, "[Scope::rebased] subtree is null");
  Scope s = *this;
  s.out_ = nullptr;
  s.in_ = subtree;
  s.specs_ = nullptr;
  s.mode_ = Mode::Apply;
  s.root_ = path_;
  return s;
}

TensorTree Scope::params() const {
  const std::string rel = tree_path(path_);
  return rel.empty() ? *in_ : in_->subtree(rel);
}

}  // namespace distjax::nn
