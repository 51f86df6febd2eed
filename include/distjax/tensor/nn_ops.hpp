// Neural-network ops with fused, numerically stable kernels: softmax, log_softmax,
// layer norm, RMS norm, embedding lookup, cross-entropy and dropout.
// Shape legend: N rows (batch * time), C channels, V vocabulary / classes.
#pragma once

#include <cstdint>

#include "distjax/core/prng.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::tensor {

/// Softmax along `axis` (default last), max-subtracted.
Tensor softmax(const Tensor& x, int axis = -1);
Tensor log_softmax(const Tensor& x, int axis = -1);

/// Layer norm over the last dimension: (x - mean) / sqrt(var + eps) * gamma + beta.
///  x (..., C); gamma, beta (C) (beta may be undefined).
///
/// `out` is the output's dtype: F32, or the dtype a matmul will read it in (a layer under the
/// bf16 policy). The output is then that cast of the f32 output, the same bits, written in
/// one pass where the device can (bf16); the backward is the f32 output's.
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps = 1e-5f,
                  DType out = DType::F32);
/// RMS norm over the last dimension: x / sqrt(mean(x^2) + eps) * gamma. x (..., C), gamma (C).
Tensor rms_norm(const Tensor& x, const Tensor& gamma, float eps = 1e-6f);

/// Embedding lookup: table (V, C), ids (...) of i32/i64 -> (..., C). The backward
/// scatter-adds into the table's gradient (repeated ids accumulate).
Tensor embedding(const Tensor& table, const Tensor& ids);

/// Per-example cross-entropy: logits (..., V) f32, labels (...) i32/i64 in [0, V) ->
/// (...) losses, computed as logsumexp(logits) - logits[label] in one fused pass. The
/// backward is softmax(logits) - onehot(label), rebuilt from the saved row log-sum-exp.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels);

/// mean(cross_entropy(matmul(x, w, false, trans_w), labels)) without the (rows, V) logits of
/// a language model's head: the rows of x (..., K) go through in chunks whose logits take
/// about `chunk_bytes`, and where a gradient is needed each chunk's contribution to dx and
/// dw is made right there (the loss being a mean, its backward only scales them by the
/// cotangent), so no logits are kept for the backward nor computed twice. w is (V, K) with
/// trans_w (a tied embedding table) or (K, V); x and w share a dtype (f32, or bf16/f16 as
/// matmul takes them: f32 accumulation, the logits' cotangent cast to that dtype as
/// matmul's backward does). The logits are f32, except for bf16 products: then the GEMM
/// writes them in bf16 (its f32 sums rounded once, as a bf16 layer's output; half the
/// bytes of the step's largest tensor) and the loss is taken in f32 from them, i.e. the
/// composed ops on astype(astype(matmul(x, w), bf16), f32). Returns a scalar; dw comes
/// back f32, dx f32 or, where x's producer takes it so, bf16.
Tensor linear_cross_entropy_mean(const Tensor& x, const Tensor& w, const Tensor& labels,
                                 bool trans_w, std::int64_t chunk_bytes = std::int64_t{512} << 20);

/// Inverted dropout: keeps each element with probability 1 - rate and scales by
/// 1 / (1 - rate). The mask comes from `key` only, so a key gives the same mask on
/// every run. rate == 0 returns x; rate must be in [0, 1).
Tensor dropout(const Tensor& x, float rate, const Key& key);
/// Dropout of x, the block of a larger array of shape `global` starting at `block_start`
/// (one index per dimension): the mask is that block of the mask dropout(global array)
/// draws, so devices holding shards of an activation drop exactly what one device would.
Tensor dropout(const Tensor& x, float rate, const Key& key, const Shape& global,
               const std::vector<std::int64_t>& block_start);

}  // namespace distjax::tensor
