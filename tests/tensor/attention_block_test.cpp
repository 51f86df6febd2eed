// attention_block, attention_merge and attention_block_backward: the blocks of a sequence at
// random global positions, merged in any order, give the one-block attention's output and
// gradients (f32 within 1e-6), causal and not; bad positions are refused. Also run on the
// checked device (ctest's checked_attention_block).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/error.hpp"
#include "distjax/tensor/attention.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::tensor {
namespace {

// Blockwise against one block: the same sums of f32 terms, in another order and with the
// online rescale (values of size ~1).
constexpr float kTol = 1e-6f;

Tensor uniform(const Shape& shape, std::uint32_t seed) {
  std::vector<float> p(static_cast<std::size_t>(numel(shape)));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (float& v : p)
    v = dist(gen);
  return Tensor::from_vector(p, shape);
}

// A random partition of the positions [0, n) into `parts` non-empty ascending sets.
std::vector<std::vector<std::int32_t>> partition(std::int32_t n, int parts, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::int32_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen);
  std::vector<std::vector<std::int32_t>> out(static_cast<std::size_t>(parts));
  for (std::size_t i = 0; i < order.size(); ++i)
    out[i % out.size()].push_back(order[i]);
  for (auto& p : out)
    std::sort(p.begin(), p.end());
  return out;
}

// The rows of x (B, H, N, D) at `pos`, in that order: (B, H, len(pos), D).
Tensor rows(const Tensor& x, const std::vector<std::int32_t>& pos) {
  std::vector<Tensor> parts;
  for (std::int32_t p : pos)
    parts.push_back(slice(x, 2, p, p + 1));
  return concat(parts, 2);
}

Tensor positions(const std::vector<std::int32_t>& pos) {
  return Tensor::from_vector(pos, {static_cast<std::int64_t>(pos.size())});
}

void expect_near(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  float worst = 0.f;
  for (std::size_t i = 0; i < g.size(); ++i)
    worst = std::max(worst, std::abs(g[i] - w[i]));
  EXPECT_LE(worst, kTol) << what;
}

struct Case {
  bool causal;
  int query_blocks, key_blocks;
  std::uint32_t seed;
};

class AttentionBlock : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionBlock, BlocksMergedEqualOneBlockForwardAndBackward) {
  const Case c = GetParam();
  const std::int64_t b = 2, h = 3, n = 45, d = 8;  // 45 rows: past one 32-row CPU block
  const Tensor q = uniform({b, h, n, d}, c.seed), k = uniform({b, h, n, d}, c.seed + 1),
               v = uniform({b, h, n, d}, c.seed + 2), ct = uniform({b, h, n, d}, c.seed + 3);
  // The reference: one attention over the whole sequence, its gradients from the tape.
  Tensor lq = make_leaf(q), lk = make_leaf(k), lv = make_leaf(v);
  const Tensor want = attention(lq, lk, lv, c.causal);
  const std::vector<Tensor> dwant = autodiff::grad({sum(mul(want, ct))}, {Tensor()}, {lq, lk, lv});

  const auto qb = partition(static_cast<std::int32_t>(n), c.query_blocks, c.seed + 4);
  const auto kb = partition(static_cast<std::int32_t>(n), c.key_blocks, c.seed + 5);
  std::vector<Tensor> dk(kb.size()), dv(kb.size());
  for (const auto& qp : qb) {
    const Tensor qi = rows(q, qp), qpos = positions(qp);
    // Forward: merge the key blocks in reverse order (any order serves).
    AttentionPart whole;
    for (std::size_t j = kb.size(); j-- > 0;) {
      AttentionPart part = attention_block(qi, rows(k, kb[j]), rows(v, kb[j]), qpos,
                                           positions(kb[j]), c.causal);
      if (!whole.out.defined()) whole = part;
      else attention_merge(whole, part);
    }
    expect_near(whole.out, rows(want.detach(), qp), "output");
    // Backward: each key block's share of dq, and these queries' share of dk, dv.
    const Tensor gi = rows(ct, qp);
    Tensor dq;
    for (std::size_t j = 0; j < kb.size(); ++j) {
      AttentionGrads g = attention_block_backward(qi, rows(k, kb[j]), rows(v, kb[j]), qpos,
                                                  positions(kb[j]), whole, gi, c.causal);
      dq = dq.defined() ? add(dq, g.dq) : g.dq;
      dk[j] = dk[j].defined() ? add(dk[j], g.dk) : g.dk;
      dv[j] = dv[j].defined() ? add(dv[j], g.dv) : g.dv;
    }
    expect_near(dq, rows(dwant[0], qp), "dq");
  }
  for (std::size_t j = 0; j < kb.size(); ++j) {
    expect_near(dk[j], rows(dwant[1], kb[j]), "dk");
    expect_near(dv[j], rows(dwant[2], kb[j]), "dv");
  }
}

INSTANTIATE_TEST_SUITE_P(Positions, AttentionBlock,
                         ::testing::Values(Case{true, 1, 1, 10}, Case{true, 2, 3, 20},
                                           Case{true, 4, 4, 30}, Case{true, 3, 8, 40},
                                           Case{false, 2, 3, 50}));

TEST(AttentionBlock, ABlockNoQuerySeesGivesZerosAndMinusInfinity) {
  const Tensor q = uniform({1, 2, 4, 8}, 1), k = uniform({1, 2, 3, 8}, 2), v = uniform({1, 2, 3, 8}, 3);
  // Keys at 10..12 all come after the queries at 0..3.
  AttentionPart p = attention_block(q, k, v, positions({0, 1, 2, 3}), positions({10, 11, 12}));
  for (float x : p.out.to_vector<float>())
    EXPECT_EQ(x, 0.f);
  for (float x : p.lse.to_vector<float>())
    EXPECT_EQ(x, -INFINITY);
  // Merging it changes nothing, bit for bit.
  AttentionPart acc = attention_block(q, k, v, positions({20, 21, 22, 23}), positions({10, 11, 12}));
  const std::vector<float> before = acc.out.to_vector<float>();
  attention_merge(acc, p);
  EXPECT_EQ(acc.out.to_vector<float>(), before);
}

TEST(AttentionBlock, RefusesPositionsThatAreNotAscendingOrOfTheWrongSize) {
  const Tensor q = uniform({1, 1, 3, 4}, 1), k = uniform({1, 1, 3, 4}, 2);
  EXPECT_THROW(
      {
        try {
          attention_block(q, k, k, positions({0, 2, 1}), positions({0, 1, 2}));
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("q_pos must be strictly ascending"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      InvalidArgument);
  EXPECT_THROW(attention_block(q, k, k, positions({0, 1, 2}), positions({0, 1})), InvalidArgument);
  EXPECT_THROW(attention_block(q, k, k, positions({0, 1, 2}), Tensor::zeros({3}, DType::I64)),
               InvalidArgument);
}

}  // namespace
}  // namespace distjax::tensor
