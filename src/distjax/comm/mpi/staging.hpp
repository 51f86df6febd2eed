// The MPI backend's staged buffers (private to src/distjax/comm/mpi): bf16/f16 widened to
// f32, since MPI reduces no halves, and copies of small checked calls' buffers, which MPI
// may go on writing after a failed check where the caller's memory must not be.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "distjax/comm/buffer.hpp"
#include "distjax/core/dtype.hpp"

namespace distjax::comm::mpi {

inline bool is_half(DType t) { return t == DType::BF16 || t == DType::F16; }

/// dst[i] = src[i] as f32, i < n, for bf16 or f16 `src` of dtype t.
void widen_half(const void* src, std::int64_t n, DType t, float* dst);
/// dst[i] = src[i] rounded to bf16 or f16 (dtype t), i < n.
void narrow_half(const float* src, std::int64_t n, DType t, void* dst);

/// Copies of a call's send and recv that MPI is given instead of the caller's buffers.
struct Staged {
  Buffer send, recv;             // the copies (f32 where the caller's were bf16/f16)
  std::shared_ptr<void> memory;  // owns them
  /// Copies the result from the recv copy into the caller's recv (narrowing halves).
  std::function<void()> copy_back;
};
/// Stages send (copied now) and recv (copied back by copy_back).
Staged stage_copies(const Buffer& send, const Buffer& recv);

}  // namespace distjax::comm::mpi
