#include "distjax/tensor/update_ops.hpp"

#include "distjax/core/error.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {
namespace {

using detail::Dispatch;
using detail::KernelTable;

// Every operand f32 and of `param`'s shape.
void check_leaf(const char* op, const Tensor& param, std::initializer_list<const Tensor*> others) {
  DISTJAX_CHECK(param.defined() && param.dtype() == DType::F32, InvalidArgument, "[", op,
                "] the parameter must be a defined f32 tensor");
  for (const Tensor* t : others)
    DISTJAX_CHECK(t->defined() && t->dtype() == DType::F32 && t->shape() == param.shape(),
                  InvalidArgument, "[", op, "] expected f32 ", to_string(param.shape()), ", got ",
                  t->defined() ? dtype_name(t->dtype()) : "undefined", " ",
                  t->defined() ? to_string(t->shape()) : std::string());
}

}  // namespace

void sgd_update_(Tensor& param, const Tensor& grad, Tensor& buf, const SGDStep& step) {
  if (!buf.defined()) {
    check_leaf("sgd_update_", param, {&grad});
    Dispatch k("sgd_update_", &KernelTable::optim, {&param, &grad});
    k->sgd(param.data<float>(), grad.data<float>(), param.numel(), step.lr, step.weight_decay,
           k.stream());
    return;
  }
  check_leaf("sgd_update_", param, {&grad, &buf});
  Dispatch k("sgd_update_", &KernelTable::optim, {&param, &grad, &buf});
  k->sgd_momentum(param.data<float>(), grad.data<float>(), buf.data<float>(), param.numel(),
                  step.lr, step.momentum, step.weight_decay, step.nesterov, k.stream());
}

void adam_update_(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamStep& step) {
  check_leaf("adam_update_", param, {&grad, &m, &v});
  Dispatch k("adam_update_", &KernelTable::optim, {&param, &grad, &m, &v});
  k->adam(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), param.numel(),
          step.lr, step.b1, step.b2, step.eps, step.t, step.decay, step.l2, k.stream());
}

double sum_of_squares(const Tensor& x) {
  check_leaf("sum_of_squares", x, {});
  Dispatch k("sum_of_squares", &KernelTable::optim, {&x});
  double out = 0.0;
  k->sum_squares(x.data<float>(), x.numel(), &out, k.stream());
  return out;
}

void scale_(Tensor& x, double factor) {
  check_leaf("scale_", x, {});
  Dispatch k("scale_", &KernelTable::optim, {&x});
  k->scale(x.data<float>(), x.numel(), static_cast<float>(factor), k.stream());
}

}  // namespace distjax::tensor
