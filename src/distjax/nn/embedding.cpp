#include "distjax/nn/embedding.hpp"

#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::nn {

Tensor Embedding::table(const Scope& scope) const {
  DISTJAX_CHECK(num_embeddings > 0 && features > 0, InvalidArgument, "[Embedding] \"", scope.path(),
                "\" needs num_embeddings > 0 and features > 0, got ", num_embeddings, " and ",
                features);
  return scope.param("embedding", {num_embeddings, features}, embedding_init, embedding_spec);
}

Tensor Embedding::operator()(const Scope& scope, const Tensor& ids) const {
  tensor::check_defined(ids, "Embedding", "ids");
  DISTJAX_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64, InvalidArgument,
                "[Embedding] \"", scope.path(), "\" expects i32 or i64 ids, got ",
                dtype_name(ids.dtype()));
  return tensor::embedding(table(scope), ids);
}

Tensor Embedding::attend(const Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "Embedding::attend", "x");
  // The table's (local) width: a table split by columns attends with its feature block.
  const Tensor t = table(scope);
  DISTJAX_CHECK(x.rank() >= 1 && x.size(-1) == t.size(1), InvalidArgument, "[Embedding::attend] \"",
                scope.path(), "\" expects x (..., ", t.size(1), "), got ", to_string(x.shape()));
  return matmul(scope.precision(), x, t, /*trans_a=*/false, /*trans_b=*/true);
}

}  // namespace distjax::nn
