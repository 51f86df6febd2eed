// Kernel family: the fused NN ops over rows, forward and backward: softmax, layer and RMS
// norm, embedding, cross-entropy and dropout. An input (..., C) is n rows of c; f32 unless
// said otherwise; ids and labels are i32 or i64 (`id_dtype`). Plain arguments only.
#pragma once

#include <cstdint>

#include "distjax/core/dtype.hpp"
#include "distjax/core/prng.hpp"

namespace distjax::tensor::detail {

/// Which elements a dropout keeps, drawn again from the key wherever it is applied (the
/// forward and the backward): element i of run r (runs of `run` elements, n / run of them)
/// is kept when draw run_offsets[r] + i of random_bernoulli(key, ..., keep) is 1 (without
/// run_offsets: one run, run = n, from draw 0). Kept elements are multiplied by `scale`,
/// the others are 0.
struct DropoutMask {
  Key key;
  float keep;
  float scale;
  std::int64_t run;
};

struct NnKernels {
  /// y = softmax of each row of x, or log_softmax when log_form.
  void (*softmax)(const float* x, float* y, std::int64_t n, std::int64_t c, bool log_form);
  /// gx from the forward's output y and its cotangent g.
  void (*softmax_backward)(const float* y, const float* g, float* gx, std::int64_t n,
                           std::int64_t c, bool log_form);

  /// y = (x - mean) * rstd * gamma (+ beta when not null) per row; mean and rstd (n) are
  /// saved for the backward.
  void (*layer_norm)(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                     float* rstd, std::int64_t n, std::int64_t c, float eps);
  /// The same with y rounded to bf16 as it is written (bf16(float) of layer_norm's y): the
  /// input of the bf16 policy's next matmul in one pass, not an f32 y and its cast.
  void (*layer_norm_bf16)(const float* x, const float* gamma, const float* beta, bf16* y,
                          float* mean, float* rstd, std::int64_t n, std::int64_t c, float eps);
  /// gx (skipped when null), dgamma (c) and dbeta (c, skipped when null) from x, gamma,
  /// the saved mean and rstd and the cotangent g. With `gx_add` (n x c, or null) gx[i] =
  /// gx_add[i] + the norm's own (x's cotangent summed so far, a residual connection's:
  /// Node::backward_adding), in the same pass; gx_add may be gx.
  void (*layer_norm_backward)(const float* x, const float* gamma, const float* g, const float* mean,
                              const float* rstd, float* gx, const float* gx_add, float* dgamma,
                              float* dbeta, std::int64_t n, std::int64_t c);
  /// The same for a bf16 g (what a bf16 y's consumer may hand back: Node::reduced_cotangent),
  /// read as it is. Null where the device has none.
  void (*layer_norm_backward_bf16)(const float* x, const float* gamma, const bf16* g,
                                   const float* mean, const float* rstd, float* gx,
                                   const float* gx_add, float* dgamma, float* dbeta, std::int64_t n,
                                   std::int64_t c) = nullptr;
  /// y = x * rrms * gamma per row; rrms (n) = 1 / sqrt(mean(x^2) + eps) is saved.
  void (*rms_norm)(const float* x, const float* gamma, float* y, float* rrms, std::int64_t n,
                   std::int64_t c, float eps);
  /// gx (skipped when null) and dgamma (c).
  void (*rms_norm_backward)(const float* x, const float* gamma, const float* g, const float* rrms,
                            float* gx, float* dgamma, std::int64_t n, std::int64_t c);

  /// bad (2 i64) = {flat index, value} of the first of the n ids outside [0, v), or
  /// {-1, 0} when every id lies inside. The ops below stay inside their buffers whatever
  /// the ids (a device's verdict is read later: tensor::raise_deferred_errors).
  void (*find_bad_id)(const void* ids, DType id_dtype, std::int64_t n, std::int64_t v,
                      std::int64_t* bad);
  /// out (n, c): row i = table (v, c) row ids[i]; NaN where ids[i] is outside [0, v).
  void (*embedding)(const float* table, const void* ids, DType id_dtype, float* out, std::int64_t n,
                    std::int64_t c, std::int64_t v);
  /// gtable (v, c) += g's row i at row ids[i], for i < n in order (ids outside [0, v):
  /// nothing).
  void (*embedding_backward)(const float* g, const void* ids, DType id_dtype, float* gtable,
                             std::int64_t n, std::int64_t c, std::int64_t v);

  /// loss (n) = logsumexp(row) - row[label] and lse (n) = logsumexp(row), logits (n, v);
  /// the loss is NaN where the label is outside [0, v).
  void (*cross_entropy)(const float* logits, const void* labels, DType id_dtype, float* loss,
                        float* lse, std::int64_t n, std::int64_t v);
  /// gx (n, v) = g[r] * (softmax(row) - onehot(label)) from the saved lse (no onehot for
  /// a label outside [0, v)). gx may be logits (the gradient over the logits' memory).
  void (*cross_entropy_backward)(const float* logits, const float* g, const float* lse,
                                 const void* labels, DType id_dtype, float* gx, std::int64_t n,
                                 std::int64_t v);
  /// Both in one pass over the logits (the chunked head's, whose backward is known in the
  /// forward): loss and lse as cross_entropy on the logits widened to f32 (logits_dtype
  /// f32 or bf16), and gx (n, v) = g[r] * (softmax(row) - onehot(label)) as
  /// cross_entropy_backward writes it, rounded once to gx_dtype (f32, bf16 or f16: what
  /// the head's products read). gx may be the logits when the two dtypes are the same.
  void (*cross_entropy_with_grad)(const void* logits, DType logits_dtype, const void* labels,
                                  DType id_dtype, float* loss, float* lse, const float* g, void* gx,
                                  DType gx_dtype, std::int64_t n, std::int64_t v);

  /// y = x masked and scaled by `mask` (n elements); run_offsets: n / mask.run draw
  /// offsets, or null.
  void (*dropout)(const float* x, float* y, std::int64_t n, const DropoutMask& mask,
                  const std::int64_t* run_offsets);
};

}  // namespace distjax::tensor::detail
