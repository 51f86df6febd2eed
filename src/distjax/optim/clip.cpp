#include "distjax/optim/clip.hpp"

#include <cmath>

#include "distjax/core/error.hpp"
#include "distjax/tensor/update_ops.hpp"

namespace distjax::optim {

double global_norm_squared(const tensor::TensorTree& tree) {
  std::vector<tensor::Tensor> leaves;
  for (const auto& [path, t] : tree) {
    if (!is_floating(t.dtype())) continue;
    DISTJAX_CHECK(t.dtype() == DType::F32, NotImplemented, "[global_norm] leaf \"", path, "\" is ",
                  dtype_name(t.dtype()), "; only f32 is supported");
    leaves.push_back(t);
  }
  double total = 0.0;  // the leaves' sums, added in tree order
  for (double s : tensor::sums_of_squares(leaves)) total += s;
  return total;
}

double global_norm(const tensor::TensorTree& tree) {
  return std::sqrt(global_norm_squared(tree));
}

void scale_in_place(tensor::TensorTree& grads, double factor) {
  for (auto& [path, t] : grads) {
    if (!is_floating(t.dtype())) continue;
    DISTJAX_CHECK(t.dtype() == DType::F32, NotImplemented, "[scale_in_place] leaf \"", path,
                  "\" is ", dtype_name(t.dtype()), "; only f32 is supported");
    tensor::scale_(t, factor);
  }
}

double clip_by_global_norm(tensor::TensorTree& grads, double max_norm) {
  DISTJAX_CHECK(max_norm > 0.0, InvalidArgument, "[clip_by_global_norm] max_norm must be > 0, got ",
                max_norm);
  const double norm = global_norm(grads);
  if (norm > max_norm) scale_in_place(grads, max_norm / norm);
  return norm;
}

}  // namespace distjax::optim
