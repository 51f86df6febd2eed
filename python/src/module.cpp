// distjax._distjax: the compiled part of the Python package (python/distjax/ wraps it).
#include "bindings.hpp"

NB_MODULE(_distjax, m) {
  m.doc() = "DistJax's C++ core: tensors, ops, autodiff, meshes and shard_map, training";
  using namespace distjax::python;
  bind_errors(m);
  bind_tensor(m);
  bind_ops(m);
  bind_autodiff(m);
  bind_spmd(m);
  bind_train(m);
  bind_models(m);
  bind_global_view(m);
}
