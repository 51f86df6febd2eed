#include "distjax/optim/detail/leaves.hpp"

#include "distjax/core/error.hpp"
#include "distjax/tensor/update_ops.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::optim::detail {

const Tensor& checked_grad(const char* op, const std::string& path, const Tensor& p,
                           const TensorTree& grads) {
  DISTJAX_CHECK(p.dtype() == DType::F32, InvalidArgument, "[", op, "] parameter \"", path, "\" is ",
                dtype_name(p.dtype()), "; optimizers update f32 parameters");
  DISTJAX_CHECK(grads.contains(path), InvalidArgument, "[", op, "] no gradient for parameter \"",
                path, "\" (the gradient tree has ", grads.size(), " leaves)");
  const Tensor& g = grads.at(path);
  DISTJAX_CHECK(g.dtype() == DType::F32 && g.shape() == p.shape(), InvalidArgument, "[", op,
                "] gradient of \"", path, "\" is ", dtype_name(g.dtype()), " ",
                to_string(g.shape()), ", expected f32 ", to_string(p.shape()));
  return g;
}

Tensor& checked_slot(const char* op, const char* slot, const std::string& path, const Tensor& p,
                     TensorTree& state) {
  const std::string key = std::string(slot) + "/" + path;
  DISTJAX_CHECK(state.contains(key), InvalidArgument, "[", op, "] optimizer state has no \"", key,
                "\"; was the state created by this optimizer's init() for these params?");
  Tensor& s = state.at(key);
  DISTJAX_CHECK(s.dtype() == DType::F32 && s.shape() == p.shape(), InvalidArgument, "[", op,
                "] state \"", key, "\" is ", dtype_name(s.dtype()), " ", to_string(s.shape()),
                ", expected f32 ", to_string(p.shape()));
  return s;
}

void add_zero_slot(TensorTree& state, const std::string& slot, const TensorTree& params) {
  for (const auto& [path, p] : params)
    if (trainable(p)) state.set(slot + "/" + path, Tensor::zeros(p.shape(), DType::F32));
}

TensorTree adam_init(const TensorTree& params) {
  TensorTree state;
  add_zero_slot(state, "mu", params);
  add_zero_slot(state, "nu", params);
  return state;
}

void adam_update(const char* op, TensorTree& params, const TensorTree& grads, TensorTree& state,
                 std::int64_t step, double lr, double b1, double b2, double eps,
                 const std::function<double(const std::string& path)>& decay, double l2) {
  tensor::NoGradGuard no_grad;
  std::vector<tensor::UpdateLeaf> leaves;
  for (auto& [path, p] : params) {
    if (!trainable(p)) continue;
    const Tensor& g = checked_grad(op, path, p, grads);
    Tensor& m = checked_slot(op, "mu", path, p, state);
    Tensor& v = checked_slot(op, "nu", path, p, state);
    leaves.push_back({.param = &p, .grad = &g, .m = &m, .v = &v, .decay = decay(path)});
  }
  tensor::adam_update_many_(
      leaves, {.lr = lr, .b1 = b1, .b2 = b2, .eps = eps, .t = step + 1, .l2 = l2});
}

}  // namespace distjax::optim::detail
