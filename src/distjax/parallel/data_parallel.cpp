#include "distjax/parallel/data_parallel.hpp"

#include <cstring>

#include "distjax/core/error.hpp"

namespace distjax::parallel {

using tensor::Tensor;

TensorTree sync_grads(spmd::DeviceContext& ctx, const TensorTree& grads, const mesh::Axes& axes,
                      std::size_t bucket_bytes) {
  comm::Communicator& comm = ctx.comm(axes);
  if (comm.size() == 1) return grads;
  const std::int64_t bucket_elems =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(bucket_bytes / sizeof(float)));

  TensorTree out;
  std::vector<std::pair<std::string, Tensor>> pending;  // leaves of the bucket being filled
  std::int64_t pending_elems = 0;
  auto flush = [&] {
    if (pending.empty()) return;
    // The bucket is a fresh buffer: leaves may share storage (one cotangent feeding two
    // inputs), so nothing is averaged in place.
    Tensor bucket = Tensor::empty({pending_elems});
    float* p = bucket.data<float>();
    std::int64_t at = 0;
    for (auto& [_, g] : pending) {
      std::memcpy(p + at, g.data<float>(), g.nbytes());
      at += g.numel();
    }
    comm.all_reduce(p, p, pending_elems, DType::F32, comm::ReduceOp::Mean);
    at = 0;
    for (auto& [path, g] : pending) {
      out.set(path, bucket.view_rows(at, at + g.numel()).view(g.shape()));
      at += g.numel();
    }
    pending.clear();
    pending_elems = 0;
  };
  for (const auto& [path, g] : grads) {
    DISTJAX_CHECK(g.dtype() == DType::F32, InvalidArgument, "[sync_grads] gradient \"", path,
                  "\" has dtype ", dtype_name(g.dtype()), "; expected f32");
    if (pending_elems > 0 && pending_elems + g.numel() > bucket_elems) flush();
    pending.emplace_back(path, g);
    pending_elems += g.numel();
  }
  flush();
  return out;
}

}  // namespace distjax::parallel
