#include "distjax/optim/clip.hpp"

#include <cmath>

#include "distjax/core/error.hpp"
#include "distjax/tensor/update_ops.hpp"

namespace distjax::optim {

namespace {
// The floating leaves of `tree` in order; each must be f32.
std::vector<tensor::Tensor> f32_leaves(const tensor::TensorTree& tree, const char* op) {
  std::vector<tensor::Tensor> leaves;
  for (const auto& [path, t] : tree) {
    if (!is_floating(t.dtype())) continue;
    DISTJAX_CHECK(t.dtype() == DType::F32, NotImplemented, "[", op, "] leaf \"", path, "\" is ",
                  dtype_name(t.dtype()), "; only f32 is supported");
    leaves.push_back(t);
  }
  return leaves;
}
}  // namespace

double global_norm_squared(const tensor::TensorTree& tree) {
  double total = 0.0;  // the leaves' sums, added in tree order
  for (double s : tensor::sums_of_squares(f32_leaves(tree, "global_norm"))) total += s;
  return total;
}


tensor::NormAndClipFactor norm_and_clip_factor(const tensor::TensorTree& grads, double max_norm) {
  return tensor::norm_and_clip_factor(f32_leaves(grads, "norm_and_clip_factor"), max_norm);
}

void scale_in_place(tensor::TensorTree& grads, const tensor::Tensor& factor) {
  // The leaves are handles on the tree's storage: scaling them scales the tree.
  for (tensor::Tensor& t : f32_leaves(grads, "scale_in_place")) tensor::scale_by_(t, factor);
}

double global_norm(const tensor::TensorTree& tree) {
  return std::sqrt(global_norm_squared(tree));
}

void scale_in_place(tensor::TensorTree& grads, double factor) {
  for (tensor::Tensor& t : f32_leaves(grads, "scale_in_place")) tensor::scale_(t, factor);
}

double clip_by_global_norm(tensor::TensorTree& grads, double max_norm) {
  DISTJAX_CHECK(max_norm > 0.0, InvalidArgument, "[clip_by_global_norm] max_norm must be > 0, got ",
                max_norm);
  const double norm = global_norm(grads);
  if (norm > max_norm) scale_in_place(grads, max_norm / norm);
  return norm;
}

}  // namespace distjax::optim
