// The MPI backend's staged buffers (see staging.hpp).
#include "distjax/comm/mpi/staging.hpp"

#include <cstring>
#include <vector>

namespace distjax::comm::mpi {

void widen_half(const void* src, std::int64_t n, DType t, float* dst) {
  for (std::int64_t i = 0; i < n; ++i)
    dst[i] = t == DType::BF16 ? static_cast<float>(static_cast<const bf16*>(src)[i])
                              : static_cast<float>(static_cast<const f16*>(src)[i]);
}

void narrow_half(const float* src, std::int64_t n, DType t, void* dst) {
  for (std::int64_t i = 0; i < n; ++i) {
    if (t == DType::BF16) {
      static_cast<bf16*>(dst)[i] = bf16(src[i]);
    } else {
      static_cast<f16*>(dst)[i] = f16(src[i]);
    }
  }
}

Staged stage_copies(const Buffer& send, const Buffer& recv) {
  struct Copies {
    std::vector<char> send, recv;
  };
  const bool half = is_half(send.dtype);
  auto st = std::make_shared<Copies>();
  const DType t = half ? DType::F32 : send.dtype;
  const std::int64_t es = dtype_size(t);
  st->send.resize(send.count * es);
  st->recv.resize(recv.count * es);
  if (half) {
    std::vector<float> f(send.count);
    widen_half(send.data, send.count, send.dtype, f.data());
    std::memcpy(st->send.data(), f.data(), st->send.size());
  } else if (!st->send.empty()) {
    std::memcpy(st->send.data(), send.data, st->send.size());
  }
  auto copy_back = [st, recv, half] {
    if (half) {
      std::vector<float> f(recv.count);
      std::memcpy(f.data(), st->recv.data(), st->recv.size());
      narrow_half(f.data(), recv.count, recv.dtype, recv.data);
    } else if (!st->recv.empty()) {
      std::memcpy(recv.data, st->recv.data(), st->recv.size());
    }
  };
  return {Buffer{st->send.data(), send.count, t, {}}, Buffer{st->recv.data(), recv.count, t, {}},
          st, std::move(copy_back)};
}

}  // namespace distjax::comm::mpi
