// What the binding files of the Python module share: one bind_* per part of the library,
// the conversions of Python values to tensors and the device context of shard_map.
#pragma once

#include <nanobind/nanobind.h>

#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/tensor/tensor_tree.hpp"

namespace distjax::python {

namespace nb = nanobind;
using tensor::Tensor;

void bind_errors(nb::module_& m);
void bind_tensor(nb::module_& m);
void bind_ops(nb::module_& m);
void bind_autodiff(nb::module_& m);
void bind_spmd(nb::module_& m);
void bind_train(nb::module_& m);
void bind_models(nb::module_& m);
void bind_global_view(nb::module_& m);

/// A tensor over the memory of a DLPack or buffer-protocol object (NumPy, PyTorch, ...)
/// without a copy; the object stays alive while a tensor uses the memory. `as_bf16`: the
/// object holds 16-bit words to read as bf16 (NumPy's ml_dtypes.bfloat16, which the
/// Python side views as uint16 first).
Tensor tensor_from_object(nb::handle obj, bool as_bf16);

/// A parameter tree from a dict of dicts of tensors (or arrays): the path of a leaf joins
/// the keys with '/'.
tensor::TensorTree tree_of_dict(nb::handle params);

/// The device context of the shard_map body running on the calling thread; ShardingError
/// outside one (a collective called outside shard_map).
spmd::DeviceContext& current_context(const char* op);

/// Sets the calling thread's device context for its lifetime (shard_map's devices).
class ContextScope {
 public:
  explicit ContextScope(spmd::DeviceContext& ctx);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  spmd::DeviceContext* prev_;
};

}  // namespace distjax::python
