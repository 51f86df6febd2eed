// The GPT on packed documents (data::pack_documents, TransformerConfig::document_attention):
// the second document's losses take no gradient from the first document's positions with the
// mask on (and do without it), and the loss counts no position whose input is the end-of-text
// token.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/data/documents.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax {
namespace {

using tensor::Tensor;

constexpr std::int64_t kEot = 0;
// One window of two documents: the first ends with the eot at position 4.
const std::vector<std::int32_t> kTokens = {3, 5, 7, 2, 0, 4, 6, 8, 9, 2, 5, 1};
constexpr std::int64_t kFirstEnd = 5;  // positions [0, 5) are the first document
constexpr std::int64_t kT = 12;

models::TransformerConfig config(bool mask) {
  return {.vocab = 16,
          .d_model = 32,
          .num_layers = 2,
          .num_heads = 2,
          .max_len = 16,
          .document_attention = mask};
}

// The window and its next-token targets, packed.
train::Batch packed() {
  std::vector<std::int32_t> next(kTokens.begin() + 1, kTokens.end());
  next.push_back(3);
  return data::pack_documents(
      {Tensor::from_vector(kTokens, {1, kT}), Tensor::from_vector(next, {1, kT})}, kEot);
}

TEST(TransformerDocuments, PackingCountsEotTokensBeforeAndIgnoresTheirLabels) {
  const train::Batch b = packed();
  EXPECT_EQ(b.documents.to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(b.labels.to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{5, 7, 2, 0, train::kIgnoreLabel, 6, 8, 9, 2, 5, 1, 3}));
  EXPECT_EQ(b.inputs.to_vector<std::int32_t>(), kTokens);
  // Row by row: a second row starts again at document 0.
  const Tensor two = Tensor::from_vector(std::vector<std::int32_t>{0, 2, 0, 2, 2, 0}, {2, 3});
  EXPECT_EQ(data::pack_documents({two, two}, 0).documents.to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{0, 1, 1, 0, 0, 0}));
  EXPECT_THROW(data::pack_documents({two, two}, -1), InvalidArgument);
}

// d(sum of the second document's per-position losses) / d(the blocks' input x) at the first
// document's positions: exactly zero with the mask, not without.
TEST(TransformerDocuments, TheSecondDocumentTakesNoGradientFromTheFirst) {
  const Tensor tokens = Tensor::from_vector(kTokens, {1, kT});
  std::vector<std::int32_t> next(kTokens.begin() + 1, kTokens.end());
  next.push_back(3);
  const Tensor targets = Tensor::from_vector(next, {1, kT});
  for (bool mask : {true, false}) {
    const models::Transformer gpt(config(mask));
    const tensor::TensorTree p = gpt.init(Key::from_seed(3));
    const nn::Scope scope = nn::Scope::apply(&p, false);
    const Tensor x = tensor::make_leaf(gpt.embed(scope, tokens).detach());  // (1, T, C)
    Tensor h = x;
    for (int i = 0; i < 2; ++i)
      h = gpt.block(scope, i, h, packed().documents);
    const Tensor losses = tensor::cross_entropy(gpt.head(scope, h), targets);  // (1, T)
    const Tensor second = tensor::sum(tensor::slice(losses, 1, kFirstEnd, kT));
    const std::vector<float> g = autodiff::grad({second}, {Tensor()}, {x})[0].to_vector<float>();
    const std::int64_t c = 32;
    double first = 0, own = 0;
    for (std::int64_t t = 0; t < kT; ++t)
      for (std::int64_t j = 0; j < c; ++j)
        (t < kFirstEnd ? first : own) += std::abs(g[static_cast<std::size_t>(t * c + j)]);
    EXPECT_GT(own, 0.0) << "mask " << mask;
    if (mask)
      EXPECT_EQ(first, 0.0) << "the first document's inputs reach the second's losses";
    else
      EXPECT_GT(first, 0.0) << "without the mask the documents should mix";
  }
}

// Changing the first document's tokens leaves the second's logits as they are (the model's
// own forward on the packed batch's ids).
TEST(TransformerDocuments, ChangingTheFirstDocumentLeavesTheSecondsLogits) {
  std::vector<std::int32_t> changed = kTokens;
  changed[0] = 9, changed[2] = 11;
  for (bool mask : {true, false}) {
    const models::Transformer gpt(config(mask));
    const tensor::TensorTree p = gpt.init(Key::from_seed(4));
    const nn::Scope scope = nn::Scope::apply(&p, false);
    const Tensor ids = packed().documents;  // the eot stays where it was
    const std::vector<float> a =
        gpt(scope, Tensor::from_vector(kTokens, {1, kT}), ids).to_vector<float>();
    const std::vector<float> b =
        gpt(scope, Tensor::from_vector(changed, {1, kT}), ids).to_vector<float>();
    const std::size_t from = static_cast<std::size_t>(kFirstEnd * 16);
    const bool same = std::vector<float>(a.begin() + from, a.end()) ==
                      std::vector<float>(b.begin() + from, b.end());
    EXPECT_EQ(same, mask) << "mask " << mask;
  }
}

// The loss is the sum over the positions whose input is not the eot, divided by all
// positions (so data replicas and micro-batches average to one device's loss).
TEST(TransformerDocuments, TheLossSkipsTheEotPositions) {
  const Tensor tokens = Tensor::from_vector(kTokens, {1, kT});
  std::vector<std::int32_t> next(kTokens.begin() + 1, kTokens.end());
  next.push_back(3);
  const Tensor targets = Tensor::from_vector(next, {1, kT});
  const train::Batch b = packed();
  const models::Transformer gpt(config(true));
  const tensor::TensorTree p = gpt.init(Key::from_seed(5));
  const nn::Scope scope = nn::Scope::apply(&p, false);
  const std::vector<float> per =
      tensor::cross_entropy(gpt(scope, tokens, b.documents), targets).to_vector<float>();
  double want = 0;
  for (std::int64_t t = 0; t < kT; ++t)
    if (kTokens[static_cast<std::size_t>(t)] != kEot) want += per[static_cast<std::size_t>(t)];
  want /= kT;
  EXPECT_NEAR(gpt.loss(scope, tokens, b.labels, b.documents).item<float>(), want, 1e-5);
  // The logits' own loss (a pipeline's last chunk) counts the same positions.
  EXPECT_NEAR(
      gpt.loss_of_logits(scope, gpt(scope, tokens, b.documents), b.labels, b.documents)
          .item<float>(),
      want, 1e-5);
  // A batch that packs no documents: every position counts.
  const models::Transformer all(config(false));
  double mean = 0;
  for (float v : tensor::cross_entropy(all(scope, tokens), targets).to_vector<float>())
    mean += v;
  EXPECT_NEAR(all.loss(scope, tokens, targets).item<float>(), mean / kT, 1e-5);
}

}  // namespace
}  // namespace distjax
