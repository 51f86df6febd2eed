// Forward values of the fused ops against straightforward reference loops (double
// precision), fused gradients against the same math composed from primitive ops at sizes
// that take the parallel paths, and the error messages of bad shapes and dtypes.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "checked_parity.hpp"
#include "distjax/distjax.hpp"
#include "distjax/tensor/cpu/grain.hpp"
#include "distjax/tensor/detail/fast_math.hpp"
#include "distjax/tensor/detail/kernels.hpp"
#include "grad_check.hpp"

namespace distjax::tensor {
namespace {

using testing::expect_close;
using testing::expect_same_on_checked;
using testing::host_uniform;
using testing::uniform;

// Gradients of sum(f(x) * ct) with respect to every input.
std::vector<Tensor> grads_of(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::vector<Tensor>& xs, const Tensor& ct) {
  std::vector<Tensor> leaves;
  for (const Tensor& x : xs)
    leaves.push_back(make_leaf(x));
  Tensor y = f(leaves);
  return autodiff::grad({sum(mul(y, ct))}, {Tensor()}, leaves);
}

// On a device other than the CPU an id check reports at the next read: ask for it.
template <class F>
void expect_invalid_saying(F f, const std::string& text) {
  try {
    f();
    raise_deferred_errors();
    ADD_FAILURE() << "expected InvalidArgument saying " << text;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}
template <class F>
void expect_throws_naming(F f, const std::string& op) {
  expect_invalid_saying(f, "[" + op + "]");
}

// ---------------------------------------------------------------- fast math

TEST(FastMath, ExpMatchesStdExp) {
  for (float x = -87.f; x < 88.f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    ASSERT_NEAR(detail::fast_exp(x), want, 3e-7 * want) << x;
  }
  EXPECT_EQ(detail::fast_exp(-INFINITY), 0.f);
  EXPECT_EQ(detail::fast_exp(-100.f), 0.f);
  EXPECT_EQ(detail::fast_exp(0.f), 1.f);
  EXPECT_TRUE(std::isfinite(detail::fast_exp(1000.f)));
}

TEST(FastMath, TanhErfSigmoidMatchLibm) {
  for (float x = -12.f; x < 12.f; x += 0.00071f) {
    const double t = std::tanh(double(x));
    ASSERT_NEAR(detail::fast_tanh(x), t, 4e-7 * std::max(1e-3, std::abs(t))) << x;
    ASSERT_NEAR(detail::fast_erf(x), std::erf(double(x)), 6e-7) << x;
    ASSERT_NEAR(detail::fast_sigmoid(x), 1.0 / (1.0 + std::exp(-double(x))), 2e-7) << x;
  }
  EXPECT_EQ(detail::fast_tanh(1e-6f), 1e-6f);
  EXPECT_LT(detail::fast_sigmoid(-200.f), 1e-38f);
  EXPECT_EQ(detail::fast_sigmoid(200.f), 1.f);
}

TEST(Activations, ValuesMatchLibmFormulas) {
  Tensor x = uniform({5000}, 77, -6.f, 6.f);
  const std::vector<float> px = x.to_vector<float>();
  auto ref = [&](double (*f)(double)) {
    std::vector<double> r(5000);
    for (int i = 0; i < 5000; ++i)
      r[i] = f(px[i]);
    return r;
  };
  expect_close(exp(x), ref([](double v) { return std::exp(v); }), 1e-6, "exp");
  expect_close(tanh(x), ref([](double v) { return std::tanh(v); }), 1e-6, "tanh");
  expect_close(sigmoid(x), ref([](double v) { return 1 / (1 + std::exp(-v)); }), 1e-6, "sigmoid");
  expect_close(silu(x), ref([](double v) { return v / (1 + std::exp(-v)); }), 1e-6, "silu");
  expect_close(gelu(x, false),
               ref([](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }), 1e-6,
               "gelu erf");
  expect_close(gelu(x, true), ref([](double v) {
                 return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
               }),
               1e-6, "gelu tanh");
  Tensor pos = uniform({100}, 78, 0.5f, 3.f);
  for (double p : {1.0, 2.0, 3.0, 0.5, -1.0, 1.7}) {
    std::vector<double> want;
    for (float v : pos.to_vector<float>())
      want.push_back(std::pow(double(v), p));
    expect_close(pow_scalar(pos, p), want, 1e-6, "pow_scalar");
  }
}

// ---------------------------------------------------------------- forward values

TEST(NnOps, SoftmaxAndLogSoftmaxMatchReference) {
  const std::int64_t n = 7, c = 33;
  Tensor x = uniform({n, c}, 1, -20.f, 20.f);
  std::vector<double> sm(n * c), lsm(n * c);
  const std::vector<float> px = x.to_vector<float>();
  for (std::int64_t r = 0; r < n; ++r) {
    double m = -1e30, s = 0;
    for (std::int64_t j = 0; j < c; ++j)
      m = std::max(m, double(px[r * c + j]));
    for (std::int64_t j = 0; j < c; ++j)
      s += std::exp(px[r * c + j] - m);
    for (std::int64_t j = 0; j < c; ++j) {
      sm[r * c + j] = std::exp(px[r * c + j] - m) / s;
      lsm[r * c + j] = px[r * c + j] - m - std::log(s);
    }
  }
  expect_close(softmax(x), sm, 1e-5, "softmax");
  expect_close(log_softmax(x), lsm, 1e-5, "log_softmax");
  // Along another axis: the transpose of the last-axis result.
  expect_close(softmax(transpose(x), 0), transpose(softmax(x)), 1e-6, "softmax axis 0");
  // Large logits stay finite (max subtraction).
  Tensor big = Tensor::from_vector<float>({1000.f, 1001.f, -1000.f}, {3});
  expect_close(softmax(big), {1 / (1 + std::exp(1.0)), 1 / (1 + std::exp(-1.0)), 0.0}, 1e-6,
               "stable");
}

TEST(NnOps, LayerNormAndRmsNormMatchReference) {
  const std::int64_t n = 5, c = 19;
  Tensor x = uniform({n, c}, 2, -3.f, 5.f), g = uniform({c}, 3), b = uniform({c}, 4);
  std::vector<double> ln(n * c), ln_nb(n * c), rms(n * c);
  const std::vector<float> px = x.to_vector<float>(), pg = g.to_vector<float>(),
                           pb = b.to_vector<float>();
  for (std::int64_t r = 0; r < n; ++r) {
    double m = 0, v = 0, ss = 0;
    for (std::int64_t j = 0; j < c; ++j)
      m += px[r * c + j] / double(c);
    for (std::int64_t j = 0; j < c; ++j)
      v += std::pow(px[r * c + j] - m, 2) / c;
    for (std::int64_t j = 0; j < c; ++j)
      ss += std::pow(px[r * c + j], 2) / c;
    for (std::int64_t j = 0; j < c; ++j) {
      const double xh = (px[r * c + j] - m) / std::sqrt(v + 1e-5);
      ln[r * c + j] = xh * pg[j] + pb[j];
      ln_nb[r * c + j] = xh * pg[j];
      rms[r * c + j] = px[r * c + j] / std::sqrt(ss + 1e-6) * pg[j];
    }
  }
  expect_close(layer_norm(x, g, b), ln, 1e-5, "layer_norm");
  expect_close(layer_norm(x, g, Tensor()), ln_nb, 1e-5, "layer_norm without beta");
  expect_close(rms_norm(x, g), rms, 1e-5, "rms_norm");
}

// layer_norm's `out`: the cast of the f32 output, bit for bit, and the same gradients; a
// bf16 output is written by the bf16 kernel (the CPU's and the checked device's alike).
TEST(NnOps, LayerNormWritesTheOutputDtypeAsTheCastOfItsF32Output) {
  const Tensor x = uniform({6, 40}, 3), g = uniform({40}, 4), b = uniform({40}, 5),
               ct = uniform({6, 40}, 6);
  for (DType out : {DType::BF16, DType::F16})
    for (bool bias : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(out)) + (bias ? ", bias" : ", no bias"));
      auto run = [&](bool cast_after, Device dev) {
        DeviceScope scope(dev);
        Tensor lx = make_leaf(x.to(dev)), lg = make_leaf(g.to(dev)), lb = make_leaf(b.to(dev));
        Tensor y = cast_after ? astype(layer_norm(lx, lg, bias ? lb : Tensor(), 1e-5f), out)
                              : layer_norm(lx, lg, bias ? lb : Tensor(), 1e-5f, out);
        EXPECT_EQ(y.dtype(), out);
        std::vector<Tensor> r =
            autodiff::grad({sum(mul(astype(y, DType::F32), ct.to(dev)))}, {Tensor()}, {lx, lg, lb});
        r.insert(r.begin(), astype(y, DType::F32));
        for (Tensor& t : r)
          t = t.defined() ? t.to(Device::cpu()) : t;
        return r;
      };
      const std::vector<Tensor> want = run(true, Device::cpu());
      for (Device dev : {Device::cpu(), Device{DeviceKind::Checked, 0}}) {
        const std::vector<Tensor> got = run(false, dev);
        for (std::size_t i = 0; i < want.size(); ++i) {
          if (!want[i].defined()) continue;
          EXPECT_EQ(got[i].to_vector<float>(), want[i].to_vector<float>())
              << dev.str() << ", output " << i;
        }
      }
    }
  EXPECT_THROW(layer_norm(x, g, b, 1e-5f, DType::I32), InvalidArgument);
}

// A bf16 layer-norm output read by a bf16 linear: the linear writes its dX in bf16 (the
// norm takes its cotangent so) and the norm's backward reads it as it is, giving bit for bit
// what the f32 backward gives for that cotangent widened.
TEST(NnOps, LayerNormReadsABf16CotangentAsItComes) {
  const Tensor x = uniform({6, 40}, 13), g = uniform({40}, 14), b = uniform({40}, 15);
  const Tensor w16 = astype(uniform({40, 24}, 16), DType::BF16), r = uniform({6, 24}, 17);
  for (Device dev : {Device::cpu(), Device{DeviceKind::Checked, 0}}) {
    SCOPED_TRACE(dev.str());
    DeviceScope scope(dev);
    Tensor lx = make_leaf(x.to(dev)), lg = make_leaf(g.to(dev)), lb = make_leaf(b.to(dev));
    const Tensor y = layer_norm(lx, lg, lb, 1e-5f, DType::BF16);
    const std::vector<Tensor> got =
        autodiff::grad({sum(mul(linear(y, w16.to(dev)), r.to(dev)))}, {Tensor()}, {lx, lg, lb});
    // The reference: dY = bf16(bf16(r) w^T), through the f32 norm's backward.
    NoGradGuard off;
    const Tensor dy = astype(
        astype(matmul(astype(r.to(dev), DType::BF16), w16.to(dev), false, true), DType::BF16),
        DType::F32);
    Tensor fx = make_leaf(x.to(dev)), fg = make_leaf(g.to(dev)), fb = make_leaf(b.to(dev));
    std::vector<Tensor> want;
    {
      EnableGradGuard on;
      want =
          autodiff::grad({sum(mul(layer_norm(fx, fg, fb, 1e-5f), dy))}, {Tensor()}, {fx, fg, fb});
    }
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(got[i].to(Device::cpu()).to_vector<float>(),
                want[i].to(Device::cpu()).to_vector<float>())
          << "gradient " << i;
  }
}

// gelu's `out`: the cast of the f32 output, bit for bit, with the same gradient; and a unary
// op's backward keeps only what its derivative reads (GELU's x, tanh's output), so GELU's
// output is not held by the tape.
// A norm after a residual connection: x feeds the norm and, later in the forward, another
// op (the residual), whose backward runs first. The norm's backward adds its cotangent for x
// into the one the tape has summed so far, in its own pass and in that cotangent's memory
// (Node::backward_adding): the bits of its own cotangent and the tape's add, and a lower
// peak. Measured against the same graph with that path turned off.
TEST(NnOps, LayerNormAddsIntoTheResidualsCotangent) {
  const Tensor x = uniform({64, 256}, 18), g = uniform({256}, 19), b = uniform({256}, 20);
  const Tensor r1 = uniform({64, 256}, 21), r2 = uniform({64, 256}, 22);
  for (Device dev : {Device::cpu(), Device{DeviceKind::Checked, 0}})
    for (bool bf16_out : {false, true}) {
      SCOPED_TRACE(dev.str() + (bf16_out ? ", bf16 output" : ""));
      DeviceScope scope(dev);
      struct Run {
        std::vector<std::vector<float>> grads;
        std::int64_t extra_peak;
      };
      auto run = [&](bool adding) {
        Tensor lx = make_leaf(x.to(dev)), lg = make_leaf(g.to(dev)), lb = make_leaf(b.to(dev));
        const Tensor y = layer_norm(lx, lg, lb, 1e-5f, bf16_out ? DType::BF16 : DType::F32);
        if (!adding) y.grad_node()->backward_adding = nullptr;
        const Tensor res = mul(lx, r2.to(dev));  // the residual branch: newer, its backward first
        const Tensor loss = add(sum(mul(astype(y, DType::F32), r1.to(dev))), sum(res));
        const std::int64_t live = live_bytes();
        reset_peak_bytes();
        const std::vector<Tensor> gr = autodiff::grad({loss}, {Tensor()}, {lx, lg, lb});
        Run out{{}, peak_bytes() - live};
        for (const Tensor& t : gr)
          out.grads.push_back(t.to(Device::cpu()).to_vector<float>());
        return out;
      };
      const Run fused = run(true), plain = run(false);
      for (std::size_t i = 0; i < plain.grads.size(); ++i)
        EXPECT_EQ(fused.grads[i], plain.grads[i]) << "gradient " << i;
      // (With a bf16 y, the casts' tensors set the peak elsewhere.)
      if (!bf16_out) {
        EXPECT_LT(fused.extra_peak, plain.extra_peak)
            << "the norm's cotangent for x was not added in the residual's memory";
      }
    }
}

TEST(Activations, GeluWritesTheOutputDtypeAndItsBackwardKeepsOnlyTheInput) {
  const Tensor x = uniform({5, 36}, 8), ct = uniform({5, 36}, 9);
  for (bool approximate : {true, false})
    for (DType out : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(approximate ? "tanh form, " : "erf form, ") + dtype_name(out));
      auto run = [&](bool cast_after, Device dev) {
        DeviceScope scope(dev);
        Tensor lx = make_leaf(x.to(dev));
        Tensor y = cast_after ? astype(gelu(lx, approximate), out) : gelu(lx, approximate, out);
        EXPECT_EQ(y.dtype(), out);
        const Tensor g =
            autodiff::grad({sum(mul(astype(y, DType::F32), ct.to(dev)))}, {Tensor()}, {lx})[0];
        return std::vector<Tensor>{astype(y, DType::F32).to(Device::cpu()), g.to(Device::cpu())};
      };
      const std::vector<Tensor> want = run(true, Device::cpu());
      for (Device dev : {Device::cpu(), Device{DeviceKind::Checked, 0}}) {
        const std::vector<Tensor> got = run(false, dev);
        for (std::size_t i = 0; i < want.size(); ++i)
          EXPECT_EQ(got[i].to_vector<float>(), want[i].to_vector<float>())
              << dev.str() << (i ? ", gradient" : ", output");
      }
    }
  const Tensor leaf = make_leaf(x);
  EXPECT_TRUE(gelu(leaf).sole_owner()) << "the tape holds GELU's output";
  EXPECT_TRUE(gelu(leaf, true, DType::BF16).sole_owner()) << "the tape holds GELU's output";
  EXPECT_FALSE(tanh(leaf).sole_owner()) << "tanh's backward reads its output";
  EXPECT_THROW(gelu(x, true, DType::I32), InvalidArgument);
}

TEST(NnOps, EmbeddingGathersRowsAndScatterAddsRepeats) {
  Tensor table = uniform({4, 3}, 5);
  Tensor ids = Tensor::from_vector<std::int64_t>({2, 0, 2, 2}, {2, 2});
  Tensor out = embedding(table, ids);
  EXPECT_EQ(out.shape(), (Shape{2, 2, 3}));
  const std::vector<float> pt = table.to_vector<float>();
  std::vector<double> want;
  for (int id : {2, 0, 2, 2})
    for (int j = 0; j < 3; ++j)
      want.push_back(pt[id * 3 + j]);
  expect_close(out, want, 0, "embedding");
  Tensor ct = uniform({2, 2, 3}, 6);
  Tensor gt =
      grads_of([&](const std::vector<Tensor>& x) { return embedding(x[0], ids); }, {table}, ct)[0];
  const std::vector<float> pc = ct.to_vector<float>();
  std::vector<double> gwant(12, 0.0);
  const int idv[] = {2, 0, 2, 2};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      gwant[idv[i] * 3 + j] += pc[i * 3 + j];
  expect_close(gt, gwant, 1e-6, "embedding grad");
  EXPECT_EQ(gt.to_vector<float>()[3], 0.f);  // row 1 never looked up
}

TEST(NnOps, EmbeddingAtScaleTakesTheParallelPaths) {
  const std::int64_t v = 50, c = 256, n = detail::kParallelGrainMemory / c + 11;
  Tensor table = uniform({v, c}, 90);
  std::vector<std::int32_t> idv(n);
  for (std::int64_t i = 0; i < n; ++i)
    idv[i] = static_cast<std::int32_t>((i * i + 3) % v);
  Tensor ids = Tensor::from_vector(idv, {n});
  Tensor ct = uniform({n, c}, 91);
  Tensor out = embedding(table, ids);
  Tensor gt =
      grads_of([&](const std::vector<Tensor>& x) { return embedding(x[0], ids); }, {table}, ct)[0];
  std::vector<double> gwant(v * c, 0.0);
  const std::vector<float> pt = table.to_vector<float>(), pc = ct.to_vector<float>(),
                           po = out.to_vector<float>();
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < c; ++j) {
      ASSERT_EQ(po[i * c + j], pt[idv[i] * c + j]);
      gwant[idv[i] * c + j] += pc[i * c + j];
    }
  expect_close(gt, gwant, 1e-5, "embedding grad at scale");
}

TEST(NnOps, CrossEntropyMatchesReference) {
  const std::int64_t n = 6, v = 11;
  Tensor logits = uniform({2, 3, v}, 7, -30.f, 30.f);
  Tensor labels = Tensor::from_vector<std::int32_t>({0, 10, 5, 3, 3, 7}, {2, 3});
  Tensor loss = cross_entropy(logits, labels);
  EXPECT_EQ(loss.shape(), (Shape{2, 3}));
  const std::vector<float> px = logits.to_vector<float>();
  std::vector<double> want(n);
  const int lab[] = {0, 10, 5, 3, 3, 7};
  for (std::int64_t r = 0; r < n; ++r) {
    double m = -1e30, s = 0;
    for (std::int64_t j = 0; j < v; ++j)
      m = std::max(m, double(px[r * v + j]));
    for (std::int64_t j = 0; j < v; ++j)
      s += std::exp(px[r * v + j] - m);
    want[r] = m + std::log(s) - px[r * v + lab[r]];
  }
  expect_close(loss, want, 1e-5, "cross_entropy");
}

// The gradient of the logits takes their memory when only the tape kept them (a language
// model's largest tensor), and leaves them alone when the caller still holds them.
TEST(NnOps, CrossEntropyBackwardTakesTheLogitsMemoryOnlyWhenNobodyElseHasIt) {
  constexpr std::int64_t n = 64, d = 8, v = 1000;
  const std::int64_t logits_bytes = n * v * 4;
  const Tensor h0 = uniform({n, d}, 11), w0 = uniform({d, v}, 12);
  std::vector<std::int32_t> y(n);
  for (std::int64_t i = 0; i < n; ++i)
    y[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 37) % v);
  const Tensor labels = Tensor::from_vector(y, {n}, current_device());
  struct Run {
    std::vector<float> gh, gw;
    std::int64_t extra_peak;
    bool kept_unchanged = true;
  };
  auto run = [&](bool caller_keeps_logits) {
    Tensor h = make_leaf(h0), w = make_leaf(w0);
    Tensor logits = matmul(h, w);
    const std::vector<float> before = logits.to_vector<float>();
    Tensor loss = mean(cross_entropy(logits, labels));
    Tensor kept = caller_keeps_logits ? logits : Tensor();
    logits = Tensor();
    const std::int64_t live = live_bytes();
    reset_peak_bytes();
    const std::vector<Tensor> g = autodiff::grad({loss}, {Tensor()}, {h, w});
    Run r{g[0].to_vector<float>(), g[1].to_vector<float>(), peak_bytes() - live};
    if (caller_keeps_logits) r.kept_unchanged = kept.to_vector<float>() == before;
    return r;
  };
  const Run alone = run(false), held = run(true);
  EXPECT_EQ(alone.gh, held.gh);
  EXPECT_EQ(alone.gw, held.gw);
  EXPECT_TRUE(held.kept_unchanged) << "the backward wrote over logits the caller holds";
  EXPECT_LT(alone.extra_peak, logits_bytes / 2) << "the gradient did not take the logits' memory";
  EXPECT_GE(held.extra_peak, logits_bytes);
}

TEST(NnOps, DropoutIsDeterministicPerKeyAndScalesKeptValues) {
  const std::int64_t n = detail::kParallelGrainMemory + 1000;  // the parallel path
  Tensor x = uniform({n}, 8, 1.f, 2.f);
  const float rate = 0.25f;
  Tensor a = dropout(x, rate, Key::from_seed(1)), b = dropout(x, rate, Key::from_seed(1));
  Tensor c = dropout(x, rate, Key::from_seed(2));
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  std::int64_t kept = 0;
  const std::vector<float> pa = a.to_vector<float>(), px = x.to_vector<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    if (pa[i] == 0.f) continue;
    ++kept;
    ASSERT_FLOAT_EQ(pa[i], px[i] / (1.f - rate));
  }
  EXPECT_NEAR(double(kept) / n, 1.0 - rate, 0.02);
  EXPECT_TRUE(dropout(x, 0.f, Key::from_seed(1)).shares_storage_with(x));
  // The backward applies the same mask and scale.
  Tensor ct = Tensor::ones({n});
  Tensor gx = grads_of(
      [&](const std::vector<Tensor>& in) { return dropout(in[0], rate, Key::from_seed(1)); }, {x},
      ct)[0];
  const std::vector<float> pg = gx.to_vector<float>();
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_FLOAT_EQ(pg[i], pa[i] == 0.f ? 0.f : 1.f / (1.f - rate));
}

// Reference attention in double: q (B,H,T,D), k/v (B,H,S,D).
std::vector<double> attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                        bool causal, double scale) {
  const std::int64_t bh = q.size(0) * q.size(1), t = q.size(2), s = k.size(2), d = q.size(3);
  const std::vector<float> pq = q.to_vector<float>(), pk = k.to_vector<float>(),
                           pv = v.to_vector<float>();
  std::vector<double> out(bh * t * d, 0.0);
  for (std::int64_t h = 0; h < bh; ++h)
    for (std::int64_t i = 0; i < t; ++i) {
      const std::int64_t vis = causal ? std::clamp<std::int64_t>(i + 1 + s - t, 0, s) : s;
      std::vector<double> sc(vis);
      double m = -1e300, sum = 0;
      for (std::int64_t j = 0; j < vis; ++j) {
        double acc = 0;
        for (std::int64_t e = 0; e < d; ++e)
          acc += double(pq[(h * t + i) * d + e]) * pk[(h * s + j) * d + e];
        sc[j] = acc * scale;
        m = std::max(m, sc[j]);
      }
      for (std::int64_t j = 0; j < vis; ++j)
        sum += (sc[j] = std::exp(sc[j] - m));
      for (std::int64_t j = 0; j < vis; ++j)
        for (std::int64_t e = 0; e < d; ++e)
          out[(h * t + i) * d + e] += sc[j] / sum * pv[(h * s + j) * d + e];
    }
  return out;
}

TEST(Attention, MatchesReferenceLoops) {
  struct Case {
    std::int64_t b, h, t, s, d;
    bool causal;
    float scale;
  };
  for (const Case& c : {Case{2, 3, 70, 70, 16, true, 0.f}, Case{1, 2, 40, 75, 8, false, 0.f},
                        Case{2, 2, 33, 50, 8, true, 0.3f}, Case{1, 1, 1, 1, 4, true, 0.f}}) {
    Tensor q = uniform({c.b, c.h, c.t, c.d}, 10, -2.f, 2.f);
    Tensor k = uniform({c.b, c.h, c.s, c.d}, 11, -2.f, 2.f);
    Tensor v = uniform({c.b, c.h, c.s, c.d}, 12);
    const double scale = c.scale != 0.f ? c.scale : 1.0 / std::sqrt(double(c.d));
    expect_close(attention(q, k, v, c.causal, c.scale),
                 attention_reference(q, k, v, c.causal, scale), 2e-5, "attention");
  }
}

TEST(Attention, CausalRowsWithoutVisibleKeysAreZero) {
  // T > S: the first T - S queries see no key.
  Tensor q = uniform({1, 1, 5, 4}, 13), k = uniform({1, 1, 3, 4}, 14),
         v = uniform({1, 1, 3, 4}, 15);
  Tensor o = attention(q, k, v, true);
  const std::vector<float> ov = o.to_vector<float>();
  for (int i = 0; i < 2 * 4; ++i)
    EXPECT_EQ(ov[i], 0.f);
  expect_close(o, attention_reference(q, k, v, true, 0.5), 1e-5, "attention with T > S");
  // And no gradient flows from the rows that see nothing.
  std::vector<float> ctv(20, 0.f);
  for (int i = 0; i < 8; ++i)
    ctv[i] = 1.f;
  Tensor ct = Tensor::from_vector(ctv, {1, 1, 5, 4});
  auto gs =
      grads_of([](const std::vector<Tensor>& in) { return attention(in[0], in[1], in[2], true); },
               {q, k, v}, ct);
  for (const Tensor& gr : gs)
    for (float val : gr.to_vector<float>())
      EXPECT_EQ(val, 0.f);
}

// ---------------------------------------------------------------- fused vs composed gradients

// The fused ops' gradients at sizes above kParallelGrainMemory (parallel paths, per-thread
// partial sums) against the same math composed from primitive ops.
TEST(NnOps, FusedGradientsMatchComposedOpsAtScale) {
  const std::int64_t c = 256, n = detail::kParallelGrainMemory / c + 3;
  Tensor x = uniform({n, c}, 20, -2.f, 2.f), g = uniform({c}, 21, 0.5f, 1.5f), b = uniform({c}, 22);
  Tensor ct = uniform({n, c}, 23);
  auto ln_composed = [](const std::vector<Tensor>& in) {
    Tensor xc = sub(in[0], mean(in[0], {-1}, true));
    Tensor var = mean(square(xc), {-1}, true);
    return add(mul(mul(xc, rsqrt(add_scalar(var, 1e-5))), in[1]), in[2]);
  };
  auto ln_fused = [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); };
  auto gf = grads_of(ln_fused, {x, g, b}, ct), gc = grads_of(ln_composed, {x, g, b}, ct);
  for (int i = 0; i < 3; ++i)
    expect_close(gf[i], gc[i], 2e-4, "layer_norm grads");

  auto rms_composed = [](const std::vector<Tensor>& in) {
    return mul(mul(in[0], rsqrt(add_scalar(mean(square(in[0]), {-1}, true), 1e-6))), in[1]);
  };
  auto rf =
      grads_of([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, g}, ct);
  auto rc = grads_of(rms_composed, {x, g}, ct);
  for (int i = 0; i < 2; ++i)
    expect_close(rf[i], rc[i], 2e-4, "rms_norm grads");

  auto sm_composed = [](const std::vector<Tensor>& in) {
    Tensor e = exp(sub(in[0], max(in[0], {-1}, true)));
    return div(e, sum(e, {-1}, true));
  };
  expect_close(grads_of([](const std::vector<Tensor>& in) { return softmax(in[0]); }, {x}, ct)[0],
               grads_of(sm_composed, {x}, ct)[0], 1e-4, "softmax grads");
  auto lsm_composed = [](const std::vector<Tensor>& in) {
    Tensor xs = sub(in[0], max(in[0], {-1}, true));
    return sub(xs, log(sum(exp(xs), {-1}, true)));
  };
  expect_close(
      grads_of([](const std::vector<Tensor>& in) { return log_softmax(in[0]); }, {x}, ct)[0],
      grads_of(lsm_composed, {x}, ct)[0], 1e-4, "log_softmax grads");

  // cross_entropy == -sum(onehot * log_softmax) per row.
  std::vector<std::int64_t> lab(n);
  std::vector<float> onehot(n * c, 0.f);
  for (std::int64_t r = 0; r < n; ++r)
    onehot[r * c + (lab[r] = (r * 37) % c)] = 1.f;
  Tensor labels = Tensor::from_vector(lab, {n}), oh = Tensor::from_vector(onehot, {n, c});
  Tensor cl = uniform({n}, 24);
  auto ce_f = [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], labels); };
  auto ce_c = [&](const std::vector<Tensor>& in) {
    return neg(sum(mul(log_softmax(in[0]), oh), {-1}));
  };
  expect_close(cross_entropy(x, labels), ce_c({x}), 1e-5, "cross_entropy values");
  expect_close(grads_of(ce_f, {x}, cl)[0], grads_of(ce_c, {x}, cl)[0], 1e-5, "cross_entropy grads");
}

TEST(Attention, GradientsMatchComposedOpsAtGptShape) {
  // A slice of the GPT benchmark shape (T=128, D=64) against matmul/where/softmax.
  const std::int64_t b = 2, h = 2, t = 128, d = 64;
  Tensor q = uniform({b, h, t, d}, 30), k = uniform({b, h, t, d}, 31),
         v = uniform({b, h, t, d}, 32);
  Tensor ct = uniform({b, h, t, d}, 33);
  std::vector<float> mask(t * t);
  for (std::int64_t i = 0; i < t; ++i)
    for (std::int64_t j = 0; j < t; ++j)
      mask[i * t + j] = j <= i ? 1.f : 0.f;
  Tensor m = Tensor::from_vector(mask, {t, t});
  Tensor neg_inf = Tensor::full({1}, -1e30);
  auto composed = [&](const std::vector<Tensor>& in) {
    Tensor s = mul_scalar(matmul(in[0], in[1], false, true), 1.0 / std::sqrt(double(d)));
    return matmul(softmax(where(m, s, neg_inf)), in[2]);
  };
  auto fused = [](const std::vector<Tensor>& in) { return attention(in[0], in[1], in[2], true); };
  expect_close(fused({q, k, v}), composed({q, k, v}), 1e-5, "attention values");
  auto gf = grads_of(fused, {q, k, v}, ct), gc = grads_of(composed, {q, k, v}, ct);
  for (int i = 0; i < 3; ++i)
    expect_close(gf[i], gc[i], 1e-4, "attention grads");
}

// Ops skip the cotangents of inputs that do not require grad; the others must not change.
TEST(NnOps, GradientsWithOnlySomeInputsDifferentiated) {
  Tensor x = uniform({6, 8}, 60), g = uniform({8}, 61, 0.5f, 1.5f), b = uniform({8}, 62);
  Tensor w = uniform({8, 5}, 63), ct = uniform({6, 8}, 64), ct5 = uniform({6, 5}, 65);
  auto check = [&](const std::function<Tensor(const std::vector<Tensor>&)>& f,
                   const std::vector<Tensor>& in, const Tensor& cot, const char* what) {
    std::vector<Tensor> all = grads_of(f, in, cot);
    for (std::size_t i = 0; i < in.size(); ++i) {
      std::vector<Tensor> args = in;
      Tensor leaf = make_leaf(in[i]);
      args[i] = leaf;  // only input i is differentiated
      Tensor gi = autodiff::grad({sum(mul(f(args), cot))}, {Tensor()}, {leaf})[0];
      expect_close(gi, all[i], 1e-6, what);
    }
  };
  check([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, g, b},
        ct, "layer_norm");
  check([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, g}, ct,
        "rms_norm");
  check([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
        {x, w, uniform({5}, 66)}, ct5, "linear");
  check([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {x, w}, ct5, "matmul");
  Tensor q = uniform({1, 2, 4, 3}, 67), k = uniform({1, 2, 6, 3}, 68),
         v = uniform({1, 2, 6, 3}, 69);
  check([](const std::vector<Tensor>& in) { return attention(in[0], in[1], in[2], true); },
        {q, k, v}, uniform({1, 2, 4, 3}, 70), "attention");
}

// ---------------------------------------------------------------- devices

// Every fused op on the checked device gives the CPU's bits, forward and backward, at sizes
// that take the parallel paths (and so the per-thread partial sums of the norms).
TEST(NnOpsDevices, CheckedDeviceGivesTheCpuBits) {
  using V = std::vector<Tensor>;
  const std::int64_t n = 300, c = 1000;  // n c > kParallelGrainMemory
  const Tensor x = host_uniform({3, n / 3, c}, 1), g = host_uniform({c}, 2),
               b = host_uniform({c}, 3);
  for (bool lf : {false, true})
    expect_same_on_checked(lf ? "log_softmax" : "softmax",
                           [lf](const V& a) { return lf ? log_softmax(a[0]) : softmax(a[0]); }, {x},
                           {true});
  auto ln = [](const V& a) { return layer_norm(a[0], a[1], a[2]); };
  expect_same_on_checked("layer_norm", ln, {x, g, b}, {true, true, true});
  expect_same_on_checked("layer_norm, x constant", ln, {x, g, b}, {false, true, true});
  expect_same_on_checked("layer_norm without beta",
                         [](const V& a) { return layer_norm(a[0], a[1], Tensor()); }, {x, g},
                         {true, true});
  auto rms = [](const V& a) { return rms_norm(a[0], a[1]); };
  expect_same_on_checked("rms_norm", rms, {x, g}, {true, true});
  expect_same_on_checked("rms_norm, x constant", rms, {x, g}, {false, true});

  std::vector<std::int32_t> l32(n);
  std::vector<std::int64_t> l64(n);
  for (std::int64_t r = 0; r < n; ++r)
    l32[r] = static_cast<std::int32_t>(l64[r] = (r * r + 5) % c);  // repeats
  const Tensor ids32 = Tensor::from_vector(l32, {3, n / 3}, Device::cpu());
  const Tensor ids64 = Tensor::from_vector(l64, {3, n / 3}, Device::cpu());
  const Tensor table = host_uniform({c, 300}, 4);
  for (const Tensor& ids : {ids32, ids64}) {
    const std::string dt = dtype_name(ids.dtype());
    expect_same_on_checked("embedding " + dt, [](const V& a) { return embedding(a[0], a[1]); },
                           {table, ids}, {true, false});
    expect_same_on_checked("cross_entropy " + dt,
                           [](const V& a) { return cross_entropy(a[0], a[1]); }, {x, ids},
                           {true, false});
  }
  expect_same_on_checked(
      "dropout", [](const V& a) { return dropout(a[0], 0.3f, Key::from_seed(5)); }, {x}, {true});
  expect_same_on_checked(
      "dropout of a block",
      [](const V& a) {
        return dropout(a[0], 0.25f, Key::from_seed(6), {8, 400, 2000}, {2, 100, 500});
      },
      {x}, {true});
}

TEST(AttentionDevices, CheckedDeviceGivesTheCpuBits) {
  using V = std::vector<Tensor>;
  struct Case {
    std::int64_t b, h, t, s, d;
    bool causal;
  };
  for (const Case& c :
       {Case{2, 3, 70, 70, 16, true}, Case{1, 2, 40, 75, 8, false}, Case{1, 1, 5, 3, 4, true}}) {
    const Tensor q = host_uniform({c.b, c.h, c.t, c.d}, 10),
                 k = host_uniform({c.b, c.h, c.s, c.d}, 11),
                 v = host_uniform({c.b, c.h, c.s, c.d}, 12);
    expect_same_on_checked(
        "attention T=" + std::to_string(c.t) + " S=" + std::to_string(c.s),
        [causal = c.causal](const V& a) { return attention(a[0], a[1], a[2], causal); }, {q, k, v},
        {true, true, true});
  }
  for (bool causal : {true, false})
    expect_same_on_checked("attention_packed",
                           [causal](const V& a) { return attention_packed(a[0], 4, causal); },
                           {host_uniform({2, 70, 3 * 4 * 16}, 13)}, {true});
}

// An op given tensors of two devices names itself and both devices.
TEST(NnOpsDevices, MixedDevicesNameTheOpAndBothDevices) {
  const Device checked{DeviceKind::Checked, 0};
  const Tensor x = host_uniform({4, 8}, 1), g = host_uniform({8}, 2).to(checked);
  const Tensor ids = Tensor::from_vector<std::int32_t>({0, 1, 2, 3}, {4}, checked);
  const Tensor q = host_uniform({1, 1, 4, 8}, 3);
  auto expect_mixed = [](const std::function<void()>& f, const std::string& op) {
    try {
      f();
      ADD_FAILURE() << "expected InvalidArgument from [" << op << "]";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("[" + op + "]"), std::string::npos) << what;
      EXPECT_NE(what.find("checked:0"), std::string::npos) << what;
      EXPECT_NE(what.find("cpu"), std::string::npos) << what;
    }
  };
  expect_mixed([&] { layer_norm(x, g, Tensor()); }, "layer_norm");
  expect_mixed([&] { rms_norm(x, g); }, "rms_norm");
  expect_mixed([&] { embedding(x, ids); }, "embedding");
  expect_mixed([&] { cross_entropy(x, ids); }, "cross_entropy");
  expect_mixed([&] { attention(q, q.to(checked), q); }, "attention");
  expect_mixed([&] { matmul(x, x.to(checked), false, true); }, "matmul");
  expect_mixed(
      [&] {
        linear(x, host_uniform({8, 3}, 4), host_uniform({3}, 5).to(checked));
      },
      "linear");
}

// On a device the id checks of embedding and cross_entropy make the host wait for nothing:
// the kernels stay inside their buffers (NaN where an id is bad) and the first bad id is
// reported, with its op, at the next read from the device.
TEST(NnOpsDevices, BadIdsOnADeviceAreReportedAtTheNextRead) {
  const Device checked{DeviceKind::Checked, 0};
  const Tensor table = host_uniform({5, 3}, 1);
  DeviceScope on(checked);  // the cotangents' device
  const Tensor ids = Tensor::from_vector<std::int32_t>({0, 7, 2, -3}, {4}, checked);
  const std::int64_t waits = host_waits(DeviceKind::Checked);
  const Tensor out = embedding(table.to(checked), ids);
  EXPECT_EQ(host_waits(DeviceKind::Checked), waits) << "the id check waited for the device";
  try {
    (void)out.to_vector<float>();
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[embedding] id 7 at flat index 1 is outside [0, 5)"), std::string::npos)
        << what;
    EXPECT_NE(what.find("checked:0"), std::string::npos) << what;
  }
  // Reported once; the bad rows are NaN, the others the table's.
  const std::vector<float> rows = out.to_vector<float>(), t = table.to_vector<float>();
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(rows[j], t[j]);
    EXPECT_TRUE(std::isnan(rows[3 + j]));
    EXPECT_EQ(rows[6 + j], t[6 + j]);
    EXPECT_TRUE(std::isnan(rows[9 + j]));
  }
  // The backward adds nothing for a bad id.
  Tensor leaf = make_leaf(table.to(checked));
  const Tensor gt = autodiff::grad({sum(embedding(leaf, ids))}, {Tensor()}, {leaf})[0];
  EXPECT_THROW(raise_deferred_errors(), InvalidArgument);
  const std::vector<float> g = gt.to_vector<float>();
  for (int r = 0; r < 5; ++r)
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(g[r * 3 + j], r == 0 || r == 2 ? 1.f : 0.f) << r;
  // A bad label: its loss is NaN, its gradient row has no one-hot.
  Tensor logits = make_leaf(host_uniform({2, 4}, 2).to(checked));
  const Tensor labels = Tensor::from_vector<std::int32_t>({1, 4}, {2}, checked);
  const Tensor loss = cross_entropy(logits, labels);
  expect_invalid_saying([] {}, "[cross_entropy] label 4 at flat index 1 is outside [0, 4)");
  const std::vector<float> l = loss.to_vector<float>();
  EXPECT_TRUE(std::isfinite(l[0]));
  EXPECT_TRUE(std::isnan(l[1]));
  const Tensor gl =
      autodiff::grad({sum(mul(loss, Tensor::from_vector<float>({1.f, 1.f}, {2}, checked)))},
                     {Tensor()}, {logits})[0];
  const std::vector<float> gx = gl.to_vector<float>();
  float row1 = 0.f;
  for (int j = 4; j < 8; ++j)
    row1 += gx[j];
  EXPECT_NEAR(row1, 1.f, 1e-6);  // softmax only: no -1 at a label
  // Good ids queue a verdict that reads clean.
  (void)embedding(table.to(checked), Tensor::from_vector<std::int32_t>({4, 0}, {2}, checked));
  EXPECT_NO_THROW(raise_deferred_errors());
  // Many verdicts are read with one wait, and the first bad one in op order is reported.
  const Tensor dev_table = table.to(checked);
  for (int i = 0; i < 6; ++i)
    (void)embedding(dev_table, Tensor::from_vector<std::int32_t>(
                                   {i % 5, i == 3 ? 9 : 0, i == 4 ? 8 : 1}, {3}, checked));
  const std::int64_t before = host_waits(DeviceKind::Checked);
  expect_invalid_saying([] {}, "[embedding] id 9 at flat index 1 is outside [0, 5)");
  EXPECT_EQ(host_waits(DeviceKind::Checked) - before, 1);
  EXPECT_NO_THROW(raise_deferred_errors());
}

// ---------------------------------------------------------------- errors

TEST(NnOpsErrors, BadShapesAndDtypesNameTheOp) {
  Tensor x = uniform({2, 4}, 40), g4 = uniform({4}, 41), g3 = uniform({3}, 42);
  Tensor ids = Tensor::from_vector<std::int32_t>({0, 5}, {2});
  Tensor fids = Tensor::from_vector<float>({0.f, 1.f}, {2});
  expect_throws_naming([&] { layer_norm(x, g3, g4); }, "layer_norm");
  expect_throws_naming([&] { layer_norm(x, g4, g3); }, "layer_norm");
  expect_throws_naming([&] { rms_norm(x, g3); }, "rms_norm");
  expect_throws_naming([&] { rms_norm(astype(x, DType::BF16), g4); }, "rms_norm");
  expect_throws_naming([&] { softmax(x, 2); }, "softmax");
  expect_throws_naming([&] { log_softmax(Tensor::scalar(1.0)); }, "log_softmax");
  expect_throws_naming([&] { embedding(uniform({5, 3}, 43), ids); }, "embedding");  // id 5 >= V
  expect_throws_naming([&] { embedding(uniform({5, 3}, 43), fids); }, "embedding");
  expect_throws_naming([&] { embedding(g4, Tensor::from_vector<std::int32_t>({0}, {1})); },
                       "embedding");
  expect_throws_naming(
      [&] {
        cross_entropy(x, Tensor::from_vector<std::int32_t>({0, 1, 2}, {3}));
      },
      "cross_entropy");
  expect_throws_naming(
      [&] {
        cross_entropy(x, Tensor::from_vector<std::int32_t>({0, 4}, {2}));
      },
      "cross_entropy");
  expect_throws_naming([&] { cross_entropy(x, fids); }, "cross_entropy");
  expect_throws_naming([&] { dropout(x, 1.f, Key::from_seed(0)); }, "dropout");
  expect_throws_naming([&] { dropout(x, -0.1f, Key::from_seed(0)); }, "dropout");
  Tensor q = uniform({1, 2, 3, 4}, 44);
  expect_throws_naming(
      [&] {
        attention(q, uniform({1, 2, 3, 5}, 45), uniform({1, 2, 3, 5}, 46));
      },
      "attention");
  expect_throws_naming(
      [&] {
        attention(q, uniform({1, 3, 3, 4}, 45), uniform({1, 3, 3, 4}, 46));
      },
      "attention");
  expect_throws_naming([&] { attention(q, q, uniform({1, 2, 4, 4}, 47)); }, "attention");
  expect_throws_naming([&] { attention(x, x, x); }, "attention");
  expect_throws_naming([&] { attention(q, q, astype(q, DType::BF16)); }, "attention");
}

TEST(TensorOpsErrors, BadShapesAndDtypesNameTheOp) {
  Tensor a = uniform({2, 3}, 50), b = uniform({4, 5}, 51);
  expect_throws_naming([&] { add(a, b); }, "add");
  expect_throws_naming([&] { mul(a, astype(a, DType::BF16)); }, "mul");
  expect_throws_naming([&] { matmul(a, b); }, "matmul");
  expect_throws_naming(
      [&] {
        matmul(uniform({2, 2, 3}, 52), uniform({3, 2, 3, 4}, 53));
      },
      "matmul");
  expect_throws_naming([&] { matmul(uniform({3}, 54), b); }, "matmul");
  expect_throws_naming([&] { linear(a, b); }, "linear");
  expect_throws_naming([&] { linear(a, uniform({3, 5}, 55), uniform({4}, 56)); }, "linear");
  expect_throws_naming([&] { sum(a, {2}); }, "sum");
  expect_throws_naming([&] { sum_to(a, {4}); }, "sum_to");
  expect_throws_naming([&] { reshape(a, {4, 2}); }, "reshape");
  expect_throws_naming([&] { permute(a, {0, 0}); }, "permute");
  expect_throws_naming([&] { slice(a, 1, 2, 5); }, "slice");
  expect_throws_naming([&] { concat({a, b}, 0); }, "concat");
  expect_throws_naming([&] { split(a, 2, 1); }, "split");
  expect_throws_naming([&] { stack({a, b}); }, "stack");
  expect_throws_naming([&] { broadcast_to(a, {3, 3}); }, "broadcast_to");
}

}  // namespace
}  // namespace distjax::tensor
