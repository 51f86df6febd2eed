// attention and attention_packed with document ids (packed documents): each document of a
// packed sequence gets the output and gradients it gets alone, a change to one document
// moves nothing of another, and ids that are all equal change nothing. Also run on the
// checked device (ctest's checked_attention_documents).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/attention.hpp"
#include "distjax/tensor/cpu/kernels.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::tensor {
namespace {

// Gradients of sum(y * ct) against packed documents run alone: f32 sums in another order.
constexpr float kTol = 1e-5f;

Tensor uniform(const Shape& shape, std::uint32_t seed) {
  std::vector<float> p(static_cast<std::size_t>(numel(shape)));
  std::uint32_t x = 2463534242u ^ (seed * 2654435761u);
  for (float& v : p) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    v = static_cast<float>(x % 20001) / 10000.f - 1.f;
  }
  return Tensor::from_vector(p, shape);
}

// Document lengths per batch row: 37 positions each (past one 32-row block of the CPU's
// kernels), the first row's middle document across the block boundary.
const std::vector<std::vector<std::int64_t>> kDocs = {{10, 20, 7}, {5, 32}};
constexpr std::int64_t kT = 37;

// Ids (B, T): document i of a row has id i.
Tensor document_ids(const std::vector<std::vector<std::int64_t>>& docs, std::int64_t t) {
  std::vector<std::int32_t> ids;
  for (const auto& row : docs) {
    std::int64_t n = 0;
    for (std::size_t i = 0; i < row.size(); ++i)
      for (std::int64_t j = 0; j < row[i]; ++j, ++n)
        ids.push_back(static_cast<std::int32_t>(i));
    EXPECT_EQ(n, t);
  }
  return Tensor::from_vector(ids, {static_cast<std::int64_t>(docs.size()), t});
}

// Causal attention of each document alone, (B, H, T, D) laid back side by side.
Tensor per_document(const Tensor& q, const Tensor& k, const Tensor& v, DType compute = DType::F32) {
  std::vector<Tensor> rows;
  for (std::size_t b = 0; b < kDocs.size(); ++b) {
    const auto at = [&](const Tensor& x, std::int64_t s, std::int64_t e) {
      return slice(slice(x, 0, b, b + 1), 2, s, e);
    };
    std::vector<Tensor> parts;
    std::int64_t s = 0;
    for (std::int64_t n : kDocs[b]) {
      parts.push_back(
          attention(at(q, s, s + n), at(k, s, s + n), at(v, s, s + n), true, 0.f, compute));
      s += n;
    }
    rows.push_back(concat(parts, 2));
  }
  return concat(rows, 0);
}

// {y, dq, dk, dv} of sum(f(q, k, v) * ct) on fresh leaves.
template <class F>
std::vector<Tensor> value_and_grads(const F& f, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& ct) {
  Tensor lq = make_leaf(q), lk = make_leaf(k), lv = make_leaf(v);
  Tensor y = f(lq, lk, lv);
  std::vector<Tensor> g = autodiff::grad({sum(mul(y, ct))}, {Tensor()}, {lq, lk, lv});
  return {y.detach(), g[0], g[1], g[2]};
}

void expect_near(const Tensor& got, const Tensor& want, float tol, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], tol) << what << " at " << i;
}

const char* const kWhat[] = {"output", "dq", "dk", "dv"};

TEST(AttentionDocuments, EachDocumentAsIfAlone) {
  const std::int64_t b = 2, h = 3, d = 8;
  const Tensor q = uniform({b, h, kT, d}, 1), k = uniform({b, h, kT, d}, 2),
               v = uniform({b, h, kT, d}, 3), ct = uniform({b, h, kT, d}, 4);
  const Tensor ids = document_ids(kDocs, kT);
  const auto masked = [&](const Tensor& x, const Tensor& y, const Tensor& z) {
    return attention(x, y, z, true, 0.f, DType::F32, DType::F32, ids);
  };
  const std::vector<Tensor> got = value_and_grads(masked, q, k, v, ct);
  const std::vector<Tensor> want = value_and_grads(
      [](const Tensor& x, const Tensor& y, const Tensor& z) { return per_document(x, y, z); }, q, k,
      v, ct);
  for (int i = 0; i < 4; ++i)
    expect_near(got[i], want[i], kTol, kWhat[i]);
  // Without the ids the documents do mix: the test can fail.
  const std::vector<Tensor> mixed = value_and_grads(
      [](const Tensor& x, const Tensor& y, const Tensor& z) { return attention(x, y, z, true); }, q,
      k, v, ct);
  EXPECT_NE(mixed[0].to_vector<float>(), got[0].to_vector<float>());
}

TEST(AttentionDocuments, ADocumentsChangeMovesNoOtherDocument) {
  const std::int64_t b = 2, h = 2, d = 16;
  const Tensor q = uniform({b, h, kT, d}, 5), k = uniform({b, h, kT, d}, 6),
               v = uniform({b, h, kT, d}, 7), ct = uniform({b, h, kT, d}, 8);
  const Tensor ids = document_ids(kDocs, kT);
  // q, k, v changed at the first document of batch row 0 (positions [0, 10)).
  const auto perturbed = [&](const Tensor& x, std::uint32_t seed) {
    Tensor noise = uniform({1, h, 10, d}, seed);
    Tensor row0 = concat(
        {add(slice(slice(x, 0, 0, 1), 2, 0, 10), noise), slice(slice(x, 0, 0, 1), 2, 10, kT)}, 2);
    return concat({row0, slice(x, 0, 1, 2)}, 0);
  };
  const auto masked = [&](const Tensor& x, const Tensor& y, const Tensor& z) {
    return attention(x, y, z, true, 0.f, DType::F32, DType::F32, ids);
  };
  const std::vector<Tensor> base = value_and_grads(masked, q, k, v, ct);
  const std::vector<Tensor> moved =
      value_and_grads(masked, perturbed(q, 11), perturbed(k, 12), perturbed(v, 13), ct);
  // Every position past the first document (of row 0, and all of row 1): the same bits.
  for (int i = 0; i < 4; ++i) {
    const std::vector<float> x = base[i].to_vector<float>(), y = moved[i].to_vector<float>();
    std::int64_t changed_first = 0;
    for (std::int64_t bb = 0; bb < b; ++bb)
      for (std::int64_t hh = 0; hh < h; ++hh)
        for (std::int64_t t = 0; t < kT; ++t)
          for (std::int64_t c = 0; c < d; ++c) {
            const std::size_t at = static_cast<std::size_t>(((bb * h + hh) * kT + t) * d + c);
            if (bb == 0 && t < 10)
              changed_first += x[at] != y[at];
            else
              ASSERT_EQ(x[at], y[at]) << kWhat[i] << " moved at b " << bb << " t " << t;
          }
    EXPECT_GT(changed_first, 0) << kWhat[i] << " of the changed document did not move";
  }
}

TEST(AttentionDocuments, OneDocumentIsPlainAttention) {
  const std::int64_t b = 2, h = 2, d = 8;
  const Tensor q = uniform({b, h, kT, d}, 21), k = uniform({b, h, kT, d}, 22),
               v = uniform({b, h, kT, d}, 23), ct = uniform({b, h, kT, d}, 24);
  const Tensor same = Tensor::from_vector(std::vector<std::int32_t>(b * kT, 7), {b, kT});
  for (bool causal : {true, false}) {
    const std::vector<Tensor> got = value_and_grads(
        [&](const Tensor& x, const Tensor& y, const Tensor& z) {
          return attention(x, y, z, causal, 0.f, DType::F32, DType::F32, same);
        },
        q, k, v, ct);
    const std::vector<Tensor> want =
        value_and_grads([&](const Tensor& x, const Tensor& y,
                            const Tensor& z) { return attention(x, y, z, causal); },
                        q, k, v, ct);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(got[i].to_vector<float>(), want[i].to_vector<float>()) << kWhat[i] << causal;
  }
}

// attention_packed with ids against the unpacked attention with the same ids, and ids that
// are not sorted (any equal pair sees each other), without a causal mask as well.
TEST(AttentionDocuments, PackedLayoutAndAnyIds) {
  const std::int64_t b = 2, h = 3, d = 4;
  const Tensor qkv = uniform({b, kT, 3 * h * d}, 31), ct = uniform({b, kT, h * d}, 32);
  std::vector<std::int32_t> striped(static_cast<std::size_t>(b * kT));
  for (std::size_t i = 0; i < striped.size(); ++i)
    striped[i] = static_cast<std::int32_t>(i % 3);
  for (const Tensor& ids : {document_ids(kDocs, kT), Tensor::from_vector(striped, {b, kT})})
    for (bool causal : {true, false}) {
      const auto composed = [&](const Tensor& x) {
        Tensor y = permute(reshape(x, {b, kT, h, 3, d}), {3, 0, 2, 1, 4});
        std::vector<Tensor> p = split(y, 3, 0);
        const Shape hs{b, h, kT, d};
        Tensor o = attention(reshape(p[0], hs), reshape(p[1], hs), reshape(p[2], hs), causal, 0.f,
                             DType::F32, DType::F32, ids);
        return reshape(permute(o, {0, 2, 1, 3}), {b, kT, h * d});
      };
      const auto run = [&](bool packed) {
        Tensor leaf = make_leaf(qkv);
        Tensor y = packed ? attention_packed(leaf, h, causal, 0.f, DType::F32, DType::F32, ids)
                          : composed(leaf);
        return std::vector<Tensor>{y.detach(),
                                   autodiff::grad({sum(mul(y, ct))}, {Tensor()}, {leaf})[0]};
      };
      const std::vector<Tensor> got = run(true), want = run(false);
      expect_near(got[0], want[0], 1e-6f, "output");
      expect_near(got[1], want[1], kTol, "gradient");
    }
}

// The CPU's bf16 entries (what a bf16 plan runs where a library serves it) keep the ids.
TEST(AttentionDocuments, Bf16EntriesKeepTheIds) {
  struct CpuBf16Entries {
    CpuBf16Entries() { detail::cpu::set_serves_bf16_attention(true); }
    ~CpuBf16Entries() { detail::cpu::set_serves_bf16_attention(false); }
  } on;
  const std::int64_t b = 2, h = 2, d = 8;
  const Tensor q = uniform({b, h, kT, d}, 41), k = uniform({b, h, kT, d}, 42),
               v = uniform({b, h, kT, d}, 43), ct = uniform({b, h, kT, d}, 44);
  const Tensor ids = document_ids(kDocs, kT);
  const std::vector<Tensor> got = value_and_grads(
      [&](const Tensor& x, const Tensor& y, const Tensor& z) {
        return attention(x, y, z, true, 0.f, DType::BF16, DType::F32, ids);
      },
      q, k, v, ct);
  const std::vector<Tensor> want =
      value_and_grads([](const Tensor& x, const Tensor& y,
                         const Tensor& z) { return per_document(x, y, z, DType::BF16); },
                      q, k, v, ct);
  for (int i = 0; i < 4; ++i)
    expect_near(got[i], want[i], kTol, kWhat[i]);
}

TEST(AttentionDocuments, RejectsBadIds) {
  const Tensor q = uniform({2, 2, 5, 4}, 51), kv = uniform({2, 2, 6, 4}, 52);
  const Tensor ids = Tensor::from_vector(std::vector<std::int32_t>(10, 0), {2, 5});
  EXPECT_THROW(attention(q, kv, kv, true, 0.f, DType::F32, DType::F32, ids), InvalidArgument);
  EXPECT_THROW(attention(q, q, q, true, 0.f, DType::F32, DType::F32, astype(ids, DType::F32)),
               InvalidArgument);
  EXPECT_THROW(attention(q, q, q, true, 0.f, DType::F32, DType::F32, reshape(ids, {1, 10})),
               InvalidArgument);
  EXPECT_THROW(attention_packed(uniform({2, 4, 24}, 53), 2, true, 0.f, DType::F32, DType::F32, ids),
               InvalidArgument);
}

}  // namespace
}  // namespace distjax::tensor
