// The language model's head and its loss in chunks (tensor::linear_cross_entropy_mean): the
// composed ops' loss and gradients (bit for bit in one chunk), its memory (no gradient
// copies) and the dtype of the cotangent it hands x's producer.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "checked_parity.hpp"
#include "distjax/distjax.hpp"
#include "grad_check.hpp"

namespace distjax::tensor {
namespace {

using testing::expect_close;
using testing::expect_same_on_checked;
using testing::uniform;

// The composed ops' logits of the head: matmul's f32 product, rounded to bf16 for bf16
// products (the head keeps them so) and widened again for cross_entropy.
Tensor head_logits(const Tensor& x, const Tensor& w, bool trans_w) {
  const Tensor logits = matmul(x, w, false, trans_w);
  return x.dtype() == DType::BF16 ? astype(astype(logits, DType::BF16), DType::F32) : logits;
}

// The bytes of a chunk of `rows` rows of v logits for products in `dtype`.
std::int64_t chunk_of(std::int64_t rows, std::int64_t v, DType dtype) {
  return rows * v * (dtype == DType::BF16 ? 2 : 4);
}

// The head and its loss in chunks: the same mean loss and gradients as the composed
// ops (f32: up to the order of the sums; bf16: the logits round to bf16, and their
// cotangent too, in both),
// for chunks that do and do not divide the rows, w in both layouts, a cotangent other than 1.
TEST(NnOps, LinearCrossEntropyMeanMatchesTheComposedOps) {
  const std::int64_t b = 3, t = 7, k = 16, v = 50;
  const Tensor x = uniform({b, t, k}, 1), w_vk = uniform({v, k}, 2), w_kv = uniform({k, v}, 3);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(b * t));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>((i * 37 + 5) % v);
  const Tensor labels = Tensor::from_vector(ids, {b, t});
  for (DType dtype : {DType::F32, DType::BF16})
    for (bool trans_w : {true, false})
      for (std::int64_t chunk_rows : {1, 4, 21, 1000}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (trans_w ? ", w (V, K)" : ", w (K, V)") +
                     ", chunks of " + std::to_string(chunk_rows) + " rows");
        const Tensor& w = trans_w ? w_vk : w_kv;
        auto run = [&](bool fused) {
          Tensor xl = make_leaf(x), wl = make_leaf(w);
          const Tensor xc = astype(xl, dtype), wc = astype(wl, dtype);
          Tensor loss = fused ? linear_cross_entropy_mean(xc, wc, labels, trans_w,
                                                          chunk_of(chunk_rows, v, dtype))
                              : mean(cross_entropy(head_logits(xc, wc, trans_w), labels));
          std::vector<Tensor> g = autodiff::grad({mul_scalar(loss, 0.75)}, {Tensor()}, {xl, wl});
          g.insert(g.begin(), loss);
          return g;
        };
        const std::vector<Tensor> want = run(false), got = run(true);
        const double tol = dtype == DType::F32 ? 2e-6 : 1e-3;
        expect_close(got[0], want[0], tol, "loss");
        expect_close(got[1], want[1], tol, "dx");
        expect_close(got[2], want[2], tol, "dw");
      }
  // Without a gradient: the loss only.
  NoGradGuard off;
  expect_close(linear_cross_entropy_mean(x, w_vk, labels, true, 5 * v * 4),
               mean(cross_entropy(matmul(x, w_vk, false, true), labels)), 2e-6, "no-grad loss");
  const Tensor xb = astype(x, DType::BF16), wb = astype(w_vk, DType::BF16);
  expect_close(linear_cross_entropy_mean(xb, wb, labels, true, 5 * v * 2),
               mean(cross_entropy(head_logits(xb, wb, true), labels)), 2e-6, "bf16 no-grad loss");
  // On the checked device: the CPU's bits.
  expect_same_on_checked("linear_cross_entropy_mean",
                         [&](const std::vector<Tensor>& a) {
                           return linear_cross_entropy_mean(a[0], a[1], labels.to(a[0].device()),
                                                            true, 8 * v * 4);
                         },
                         {x, w_vk}, {true, true});
  EXPECT_THROW(linear_cross_entropy_mean(x, w_kv, labels, true), InvalidArgument);
  EXPECT_THROW(linear_cross_entropy_mean(x, astype(w_vk, DType::BF16), labels, true),
               InvalidArgument);
  EXPECT_THROW(linear_cross_entropy_mean(x, w_vk, Tensor::zeros({b}, DType::I32), true),
               InvalidArgument);
}

// In one chunk and for a cotangent of 1, the head's one pass over the logits (loss, lse and
// their cotangent in the products' dtype) gives the composed ops' bits: the same kernels'
// arithmetic, the cotangent rounded once as matmul's backward rounds it.
TEST(NnOps, LinearCrossEntropyMeanInOneChunkIsTheComposedOpsBitForBit) {
  const std::int64_t rows = 20, k = 24, v = 300;
  const Tensor x = uniform({rows, k}, 41), w = uniform({v, k}, 42);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>((i * 53 + 7) % v);
  const Tensor labels = Tensor::from_vector(ids, {rows});
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto run = [&](bool fused) {
      Tensor xl = make_leaf(x), wl = make_leaf(w);
      const Tensor xc = astype(xl, dtype), wc = astype(wl, dtype);
      const Tensor loss = fused ? linear_cross_entropy_mean(xc, wc, labels, true)
                                : mean(cross_entropy(head_logits(xc, wc, true), labels));
      std::vector<Tensor> g = autodiff::grad({loss}, {Tensor()}, {xl, wl});
      g.insert(g.begin(), loss);
      return g;
    };
    const std::vector<Tensor> want = run(false), got = run(true);
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(got[i].to_vector<float>(), want[i].to_vector<float>()) << (i == 0   ? "loss"
                                                                           : i == 1 ? "dx"
                                                                                    : "dw");
  }
}

// The head's memory: dw's chunk products add into dw in their GEMMs (no product of a
// chunk's own), and the backward scales dx and dw by the cotangent in place (no copies).
TEST(NnOps, LinearCrossEntropyMeanMakesNoGradientCopies) {
  constexpr std::int64_t rows = 64, k = 256, v = 512, chunk_rows = 4;
  const std::int64_t dx_bytes = rows * k * 4, dw_bytes = v * k * 4;
  const Tensor x0 = uniform({rows, k}, 21), w0 = uniform({v, k}, 22);
  std::vector<std::int32_t> ids(rows);
  for (std::int64_t i = 0; i < rows; ++i)
    ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 37 + 3) % v);
  const Tensor labels = Tensor::from_vector(ids, {rows}, current_device());
  const Tensor x = make_leaf(x0), w = make_leaf(w0);
  std::int64_t live = live_bytes();
  reset_peak_bytes();
  const Tensor loss = linear_cross_entropy_mean(x, w, labels, true, chunk_rows * v * 4);
  // What the op keeps (dx, dw, a few scalars) plus one chunk's logits, cotangent and
  // weights, far below a second dw.
  EXPECT_LT(peak_bytes() - live, dx_bytes + dw_bytes + dw_bytes / 4);
  live = live_bytes();
  reset_peak_bytes();
  const std::vector<Tensor> g = autodiff::grad({mul_scalar(loss, 0.5)}, {Tensor()}, {x, w});
  EXPECT_LT(peak_bytes() - live, dx_bytes / 4) << "the backward copied a gradient";
  // The values: the composed ops' (every step exact up to f32 sums; 0.5 scales exactly).
  const std::vector<Tensor> want =
      autodiff::grad({mul_scalar(mean(cross_entropy(matmul(x, w, false, true), labels)), 0.5)},
                     {Tensor()}, {x, w});
  expect_close(g[0], want[0], 2e-6, "dx");
  expect_close(g[1], want[1], 2e-6, "dw");
}

// The head op's own backward for the cotangent g of its loss: the cotangents it hands its
// inputs, as it makes them (the tape would widen some).
std::vector<Tensor> head_backward(const Tensor& loss, double g) {
  std::vector<Tensor> seed{Tensor::full({}, g, DType::F32, current_device())};
  return loss.grad_node()->backward(seed);
}

// Where x's producer takes a bf16 cotangent (here a linear writing bf16), dx comes back in
// bf16: the rounding of the f32 dx the same op makes for an f32-taking producer. An f16 x
// gets an f32 dx (its values lie below f16's range before a loss scale). Only the
// differentiated inputs get a gradient.
TEST(NnOps, LinearCrossEntropyMeanHandsABf16ProducerABf16Cotangent) {
  constexpr std::int64_t rows = 24, k = 32, v = 40;
  const Tensor h0 = uniform({rows, k}, 31), p0 = uniform({k, k}, 32), w0 = uniform({v, k}, 33);
  std::vector<std::int32_t> ids(rows);
  for (std::int64_t i = 0; i < rows; ++i)
    ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + 1) % v);
  const Tensor labels = Tensor::from_vector(ids, {rows}, current_device());
  for (DType dtype : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor w = astype(w0, dtype), p = astype(p0, dtype);
    // x made by a linear writing `dtype` (it takes its cotangent so), and the same values
    // through an astype (which takes an f32 cotangent).
    Tensor h = make_leaf(astype(h0, dtype));
    const Tensor x_linear = linear(h, p, Tensor(), {.out = dtype});
    Tensor dx_linear;
    {
      const Tensor loss = linear_cross_entropy_mean(x_linear, w, labels, true, 8 * v * 4);
      ASSERT_NE(loss.grad_node(), nullptr);
      dx_linear = head_backward(loss, 0.5)[0];
    }
    Tensor xf = make_leaf(astype(x_linear.detach(), DType::F32));
    const Tensor x_cast = astype(xf, dtype);
    const Tensor loss = linear_cross_entropy_mean(x_cast, w, labels, true, 8 * v * 4);
    const Tensor dx_f32 = head_backward(loss, 0.5)[0];
    ASSERT_EQ(dx_f32.dtype(), DType::F32);
    if (dtype == DType::BF16) {
      ASSERT_EQ(dx_linear.dtype(), DType::BF16);
      EXPECT_EQ(astype(dx_linear, DType::F32).to_vector<float>(),
                astype(astype(dx_f32, DType::BF16), DType::F32).to_vector<float>());
    } else {
      ASSERT_EQ(dx_linear.dtype(), DType::F32);
      EXPECT_EQ(dx_linear.to_vector<float>(), dx_f32.to_vector<float>());
    }
  }
  // w alone differentiated: no dx is made.
  const Tensor wl = make_leaf(w0);
  const Tensor loss = linear_cross_entropy_mean(h0, wl, labels, true);
  const std::vector<Tensor> g = head_backward(loss, 1.0);
  EXPECT_FALSE(g[0].defined());
  EXPECT_TRUE(g[1].defined());
}

}  // namespace
}  // namespace distjax::tensor
