// Tensor parallelism against one device: the TP classifier and every layout of the TP
// GPT (Megatron, sequence parallel, vocabulary parallel, the toolkit's gather/scatter,
// async rings one way and both ways), alone and with data parallelism, train 5 steps to
// the same losses and parameters as the same model on one device; the Megatron block's
// communication equals the analytic figure.
#include "distjax/parallel/tensor_parallel.hpp"

#include <gtest/gtest.h>

#include <map>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/data/documents.hpp"
#include "distjax/models/residual_classifier.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/optim/sgd.hpp"
#include "distjax/parallel/tp_transformer_block.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "parallel/parity_util.hpp"
#include "spmd/spmd_test_util.hpp"

namespace distjax::parallel {
namespace {

using mesh::Mesh;
using mesh::P;
using models::TransformerTP;
using spmd::DeviceContext;
using testing::expect_same_run;
using testing::ParityModel;
using testing::train_on_mesh;
using testing::train_one_device;
using testing::TrainingRun;

constexpr int kSteps = 5;
// f32, only the summation order differs between the runs (SGD, so no Adam-style
// amplification of near-zero gradients): per tensor max |diff| <= 1e-5 x max |value|.
constexpr double kTol = 1e-5;

const optim::SGD& sgd() {
  static const optim::SGD opt({.learning_rate = optim::constant_schedule(0.1)});
  return opt;
}

// ------------------------------------------------------------ the TP classifier

std::vector<train::Batch> image_batches(std::int64_t batch, std::int64_t features) {
  std::vector<train::Batch> out;
  for (int s = 0; s < kSteps; ++s) {
    Key k = Key::from_seed(7).fold_in(static_cast<std::uint64_t>(s));
    Tensor x = testing::random_tensor(k, {batch, features});
    std::vector<std::int32_t> y(batch);
    for (std::int64_t i = 0; i < batch; ++i)
      y[i] = static_cast<std::int32_t>(k.fold_in(100 + i).bits(0)[0] % 10);
    out.push_back({x, Tensor::from_vector(y, {batch})});
  }
  return out;
}

ParityModel classifier_model(const models::ResidualClassifier& model) {
  return {[&model](Key k, nn::ParamSpecs* s, DeviceContext* ctx) { return model.init(k, s, ctx); },
          [&model](const nn::Scope& scope, const train::Batch& b) {
            return tensor::mean(tensor::cross_entropy(model(scope, b.inputs), b.labels));
          }};
}

// The classifier of `c` laid out as `layout` over "model".
models::ResidualClassifier laid_out(models::ResidualClassifierConfig c, parallel::TPLayout layout,
                                    bool bidirectional = false) {
  c.tp = {.layout = layout, .bidirectional = bidirectional};
  return models::ResidualClassifier(c);
}

TEST(TPClassifier, MatchesOneDeviceOnEveryMesh) {
  const models::ResidualClassifierConfig config{
      .in_features = 24, .hidden = 32, .num_classes = 10, .num_layers = 3, .dropout = 0.f};
  const models::ResidualClassifier single(config);
  const auto batches = image_batches(16, 24);
  const TrainingRun one = train_one_device(classifier_model(single), sgd(), batches);
  const models::ResidualClassifier gather = laid_out(config, parallel::TPLayout::Gather);
  for (const Mesh& mesh :
       {Mesh({4}, {"model"}), Mesh({8}, {"model"}), Mesh({2, 4}, {"data", "model"}),
        Mesh({4, 2}, {"data", "model"}), Mesh({2, 1}, {"data", "model"})}) {
    expect_same_run(one, train_on_mesh(mesh, classifier_model(gather), sgd(), batches), kTol,
                    mesh.describe());
  }
  // The toolkit's async blocks (TPNorm, TPAsyncDense rings): the same model.
  for (bool bidirectional : {false, true}) {
    const models::ResidualClassifier async_model =
        laid_out(config, parallel::TPLayout::Async, bidirectional);
    const ParityModel am = classifier_model(async_model);
    for (const Mesh& mesh : {Mesh({4}, {"model"}), Mesh({2, 4}, {"data", "model"})})
      expect_same_run(
          one, train_on_mesh(mesh, am, sgd(), batches), kTol,
          std::string(bidirectional ? "bidirectional " : "") + "async on " + mesh.describe());
  }
  // Layout none on a mesh: every device holds the whole model (data parallel over "data").
  expect_same_run(
      one, train_on_mesh(Mesh({2, 4}, {"data", "model"}), classifier_model(single), sgd(), batches),
      kTol, "layout none on (data=2, model=4)");
}

TEST(TPClassifier, RefusesTheTransformersLayouts) {
  const models::ResidualClassifierConfig config{.in_features = 12, .hidden = 16};
  EXPECT_THROW(laid_out(config, parallel::TPLayout::Megatron), ConfigError);
  models::ResidualClassifierConfig sp = config;
  sp.tp = {.layout = parallel::TPLayout::Gather, .sequence_parallel = true};
  EXPECT_THROW(models::ResidualClassifier{sp}, ConfigError);
}

TEST(TPClassifier, ShardsAreTheSlicesOfTheSingleDeviceParameters) {
  const models::ResidualClassifierConfig config{.in_features = 12, .hidden = 16, .num_layers = 1};
  const TensorTree whole = models::ResidualClassifier(config).init(Key::from_seed(3));
  const models::ResidualClassifier model = laid_out(config, parallel::TPLayout::Gather);
  EXPECT_EQ(whole.num_elements(), model.num_params());
  nn::ParamSpecs specs;
  model.init(Key::from_seed(3), &specs);
  EXPECT_EQ(specs.at("input/kernel"), P(std::nullopt, "model"));
  EXPECT_EQ(specs.at("layers/0/fc2/kernel"), P("model", std::nullopt));
  EXPECT_EQ(specs.count("output/bias"), 0u);  // added once, replicated
  const Mesh mesh({2, 4}, {"data", "model"});
  std::vector<std::string> paths = whole.paths();
  std::vector<mesh::PartitionSpec> out_specs;
  for (const auto& p : paths)
    out_specs.push_back(specs.count(p) ? specs.at(p) : P());
  auto f = spmd::shard_map(
      mesh,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        const TensorTree mine = model.init(Key::from_seed(3), nullptr, &ctx);
        std::vector<Tensor> out;
        for (const auto& p : paths) {
          // Each shard varies over exactly the axes its spec names.
          const mesh::PartitionSpec spec = specs.count(p) ? specs.at(p) : P();
          EXPECT_EQ(mine.at(p).varying_axes(), ctx.axis_mask(spec)) << p;
          out.push_back(mine.at(p));
        }
        return out;
      },
      {}, out_specs);
  auto out = f(std::vector<Tensor>{});
  for (std::size_t j = 0; j < paths.size(); ++j)
    EXPECT_EQ(mesh::gather(out[j]).to_vector<float>(), whole.at(paths[j]).to_vector<float>())
        << paths[j];
}

// ------------------------------------------------------------ the TP GPT

models::TransformerConfig tiny_gpt(TransformerTP tp = {}) {
  return {.vocab = 32,
          .d_model = 16,
          .num_layers = 2,
          .num_heads = 4,
          .mlp_ratio = 2,
          .max_len = 8,
          .tied_embeddings = true,
          .tp = tp};
}

std::vector<train::Batch> token_batches(std::int64_t batch, std::int64_t t, std::int64_t vocab) {
  return testing::random_token_batches(kSteps, batch, t, vocab, 11);
}

ParityModel gpt_model(const models::Transformer& model) {
  return {[&model](Key k, nn::ParamSpecs* s, DeviceContext* ctx) { return model.init(k, s, ctx); },
          [&model](const nn::Scope& scope, const train::Batch& b) {
            return model.loss(scope, b.inputs, b.labels, b.documents);
          }};
}

struct Layout {
  const char* name;
  TransformerTP tp;
};

std::vector<Layout> all_layouts() {
  return {{"megatron", {.layout = TPLayout::Megatron}},
          {"megatron+sp", {.layout = TPLayout::Megatron, .sequence_parallel = true}},
          {"megatron+vocab", {.layout = TPLayout::Megatron, .vocab_parallel = true}},
          {"megatron+sp+vocab",
           {.layout = TPLayout::Megatron, .sequence_parallel = true, .vocab_parallel = true}},
          {"gather", {.layout = TPLayout::Gather}},
          {"async", {.layout = TPLayout::Async}},
          {"async-bidirectional", {.layout = TPLayout::Async, .bidirectional = true}}};
}

// The single-device reference is the plain GPT (no tensor parallelism): every layout keeps
// its parameters' paths and global shapes.
const TrainingRun& gpt_reference() {
  static const models::Transformer plain(tiny_gpt());
  static const TrainingRun one = train_one_device(gpt_model(plain), sgd(), token_batches(4, 8, 32));
  return one;
}

TEST(TPTransformer, EveryLayoutMatchesOneDevice) {
  const auto batches = token_batches(4, 8, 32);
  std::map<std::string, TrainingRun> on_2x2;
  for (const Layout& l : all_layouts()) {
    const models::Transformer model(tiny_gpt(l.tp));
    // One device through the TP code path equals the plain model...
    expect_same_run(gpt_reference(), train_one_device(gpt_model(model), sgd(), batches), kTol,
                    std::string(l.name) + " on one device");
    // ...and so does every mesh.
    for (const Mesh& mesh : {Mesh({4}, {"model"}), Mesh({2, 2}, {"data", "model"})}) {
      TrainingRun run = train_on_mesh(mesh, gpt_model(model), sgd(), batches);
      expect_same_run(gpt_reference(), run, kTol, std::string(l.name) + " on " + mesh.describe());
      on_2x2[l.name] = std::move(run);
    }
  }
  // Synchronous and asynchronous tensor parallelism agree with each other.
  expect_same_run(on_2x2.at("gather"), on_2x2.at("async"), kTol, "async vs gather");
  expect_same_run(on_2x2.at("gather"), on_2x2.at("async-bidirectional"), kTol,
                  "bidirectional vs gather");
}

TEST(TPParity, DropoutMasksAreTheSingleDeviceOnes) {
  // Each device draws its block of the mask one device draws for the whole activation:
  // with dropout on, tensor parallelism still trains the same model. (Data parallelism
  // gives each replica its own masks, so the meshes here have no data axis.)
  const auto tokens = token_batches(4, 8, 32);
  models::TransformerConfig base = tiny_gpt();
  base.dropout = 0.2f;
  const TrainingRun one = train_one_device(gpt_model(models::Transformer(base)), sgd(), tokens);
  for (const Layout& l : all_layouts()) {
    models::TransformerConfig c = base;
    c.tp = l.tp;
    const models::Transformer model(c);
    expect_same_run(one, train_on_mesh(Mesh({4}, {"model"}), gpt_model(model), sgd(), tokens), kTol,
                    std::string(l.name) + " with dropout");
  }
  const models::ResidualClassifierConfig clf{
      .in_features = 24, .hidden = 32, .num_classes = 10, .num_layers = 2, .dropout = 0.3f};
  const models::ResidualClassifier single(clf), gather = laid_out(clf, parallel::TPLayout::Gather);
  const auto images = image_batches(16, 24);
  expect_same_run(train_one_device(classifier_model(single), sgd(), images),
                  train_on_mesh(Mesh({4}, {"model"}), classifier_model(gather), sgd(), images),
                  kTol, "TP classifier with dropout");
}

TEST(TPTransformer, EightDevicesMatchOneDevice) {
  auto cfg = [](TransformerTP tp) {
    models::TransformerConfig c = tiny_gpt(tp);
    c.d_model = 32;
    c.num_heads = 8;
    return c;
  };
  const auto batches = token_batches(2, 8, 32);
  const TrainingRun one = train_one_device(gpt_model(models::Transformer(cfg({}))), sgd(), batches);
  for (const Layout& l : all_layouts()) {
    const models::Transformer model(cfg(l.tp));
    expect_same_run(one, train_on_mesh(Mesh({8}, {"model"}), gpt_model(model), sgd(), batches),
                    kTol, std::string(l.name) + " on 8 devices");
  }
}

TEST(TPTransformer, UntiedHeadAndRematMatchOneDevice) {
  auto cfg = [](TransformerTP tp) {
    models::TransformerConfig c = tiny_gpt(tp);
    c.tied_embeddings = false;
    c.remat = true;
    return c;
  };
  const auto batches = token_batches(4, 8, 32);
  const models::Transformer plain(cfg({}));
  const TrainingRun one = train_one_device(gpt_model(plain), sgd(), batches);
  for (const Layout& l : all_layouts()) {
    const models::Transformer model(cfg(l.tp));
    expect_same_run(
        one, train_on_mesh(Mesh({2, 2}, {"data", "model"}), gpt_model(model), sgd(), batches), kTol,
        std::string(l.name) + " untied, remat");
  }
}

TEST(TPTransformer, AttnAndMlpRematMatchOneDevice) {
  // The toolkit's module names: only the attention ("Attn") and only the MLP ("MLP") of
  // each block recomputed in backward, in every layout.
  auto cfg = [](TransformerTP tp) {
    models::TransformerConfig c = tiny_gpt(tp);
    c.remat_attn = true;
    c.remat_mlp = true;
    return c;
  };
  const auto batches = token_batches(4, 8, 32);
  const TrainingRun one =
      train_one_device(gpt_model(models::Transformer(tiny_gpt({}))), sgd(), batches);
  for (const Layout& l : all_layouts()) {
    const models::Transformer model(cfg(l.tp));
    expect_same_run(
        one, train_on_mesh(Mesh({2, 2}, {"data", "model"}), gpt_model(model), sgd(), batches), kTol,
        std::string(l.name) + " attn+mlp remat");
  }
}

TEST(TPTransformer, ParallelBlockMatchesOneDeviceInEveryLayout) {
  const auto batches = token_batches(4, 8, 32);
  models::TransformerConfig base = tiny_gpt();
  base.parallel_block = true;
  base.dropout = 0.1f;
  const models::Transformer plain(base);
  EXPECT_EQ(plain.init(Key::from_seed(0)).num_elements(), plain.num_params());
  EXPECT_FALSE(plain.init(Key::from_seed(0)).contains("blocks/0/ln2/scale"));
  const TrainingRun one = train_one_device(gpt_model(plain), sgd(), batches);
  for (const Layout& l : all_layouts()) {
    models::TransformerConfig c = base;
    c.tp = l.tp;
    const models::Transformer model(c);
    expect_same_run(one, train_on_mesh(Mesh({4}, {"model"}), gpt_model(model), sgd(), batches),
                    kTol, std::string(l.name) + " parallel block");
  }
  // With data parallelism too (no dropout: replicas draw their own masks).
  base.dropout = 0.f;
  const TrainingRun one_nodrop =
      train_one_device(gpt_model(models::Transformer(base)), sgd(), batches);
  for (const Layout& l : all_layouts()) {
    models::TransformerConfig c = base;
    c.tp = l.tp;
    expect_same_run(one_nodrop,
                    train_on_mesh(Mesh({2, 2}, {"data", "model"}),
                                  gpt_model(models::Transformer(c)), sgd(), batches),
                    kTol, std::string(l.name) + " parallel block, data x model");
  }
}

// Packed documents (data::pack_documents, document attention): every layout, with sequential
// and parallel blocks, carries the document ids to its attention and drops the eot positions
// from the loss as one device does.
TEST(TPTransformer, PackedDocumentsMatchOneDeviceInEveryLayout) {
  std::vector<train::Batch> batches;
  for (const train::Batch& b : token_batches(4, 8, 4))  // ids 0..3: the eot (1) ends many
    batches.push_back(data::pack_documents(b, 1));      // documents
  for (bool parallel : {false, true}) {
    models::TransformerConfig base = tiny_gpt();
    base.document_attention = true;
    base.parallel_block = parallel;
    const models::Transformer plain(base);
    const TrainingRun one = train_one_device(gpt_model(plain), sgd(), batches);
    // The ids change the run: without them the parity below would prove nothing.
    models::TransformerConfig mixed = base;
    mixed.document_attention = false;
    const models::Transformer unmasked(mixed);
    EXPECT_NE(train_one_device(gpt_model(unmasked), sgd(), batches).losses, one.losses);
    for (const Layout& l : all_layouts()) {
      models::TransformerConfig c = base;
      c.tp = l.tp;
      const models::Transformer model(c);
      expect_same_run(one, train_on_mesh(Mesh({4}, {"model"}), gpt_model(model), sgd(), batches),
                      kTol, std::string(l.name) + (parallel ? " parallel" : "") + " documents");
      // Data replicas whose windows hold different numbers of eot tokens: the same run.
      expect_same_run(one,
                      train_on_mesh(Mesh({2, 2}, {"data", "model"}), gpt_model(model), sgd(),
                                    batches),
                      kTol, std::string(l.name) + (parallel ? " parallel" : "") +
                                " documents, data x model");
    }
  }
}

// ------------------------------------------------------------ communication, analytic

// One train step of a lone TP block; returns this device's counters under "model".
struct BlockComm {
  comm::OpCounters all_reduce, all_gather, reduce_scatter;
};

BlockComm block_comm(bool sequence_parallel, int n, std::int64_t b, std::int64_t t, std::int64_t c,
                     bool parallel = false) {
  const TPTransformerBlock block{.num_heads = 4,
                                 .mlp_hidden = 2 * c,
                                 .layout = TPLayout::Megatron,
                                 .sequence_parallel = sequence_parallel,
                                 .parallel = parallel};
  BlockComm out;
  const Tensor x = testing::random_tensor(Key::from_seed(5), {b, t, c});
  auto f = spmd::shard_map(Mesh({n}, {"model"}),
                           [&](DeviceContext& ctx, const std::vector<Tensor>& in) {
                             TensorTree params;
                             block(nn::Scope::init(&params, Key::from_seed(1)).on(ctx), in[0]);
                             ctx.comm_stats().reset();
                             autodiff::value_and_grad([&](const TensorTree& p) {
                               Tensor y = block(nn::Scope::apply(&p, true).on(ctx), in[0]);
                               Tensor s = tensor::sum(y);
                               return sequence_parallel ? spmd::psum(ctx, s, "model") : s;
                             })(params);
                             if (ctx.device() == 0) {
                               const auto& st = ctx.comm_stats();
                               out = {st.of("model", comm::OpKind::AllReduce),
                                      st.of("model", comm::OpKind::AllGather),
                                      st.of("model", comm::OpKind::ReduceScatter)};
                             }
                             return std::vector<Tensor>{};
                           },
                           {sequence_parallel ? P(std::nullopt, "model") : P()}, {});
  f(std::vector<Tensor>{x});
  return out;
}

TEST(TPTransformer, MegatronBlockMovesFourAllReducesOfBTCPerStep) {
  const int n = 4;
  const std::int64_t b = 2, t = 8, c = 16;
  const std::int64_t btc = b * t * c * 4;  // bytes of one (B, T, C) f32 activation
  const BlockComm mega = block_comm(false, n, b, t, c);
  // attn and mlp: one all-reduce each forward (the row-parallel psum) and each backward
  // (the column-parallel input's pvary transpose); nothing else.
  EXPECT_EQ(mega.all_reduce.calls, 4);
  EXPECT_EQ(mega.all_reduce.bytes_sent, 4 * 2 * (n - 1) * btc / n);
  EXPECT_EQ(mega.all_gather.calls, 0);
  EXPECT_EQ(mega.reduce_scatter.calls, 0);

  // Sequence parallel: an all-gather and a reduce-scatter where Megatron all-reduces,
  // forward (gather in, scatter out) and backward (their transposes): the same bytes.
  const BlockComm sp = block_comm(true, n, b, t, c);
  EXPECT_EQ(sp.all_gather.calls, 4);
  EXPECT_EQ(sp.reduce_scatter.calls, 4);
  EXPECT_EQ(sp.all_gather.bytes_sent, 4 * (n - 1) * btc / n);
  EXPECT_EQ(sp.reduce_scatter.bytes_sent, 4 * (n - 1) * btc / n);
  EXPECT_EQ(sp.all_gather.bytes_sent + sp.reduce_scatter.bytes_sent, mega.all_reduce.bytes_sent);
  // What remains are the gradients of the replicated parameters used on T-sharded rows
  // (ln1, ln2 scale and bias, the two row-parallel biases: 6 vectors of C) and the loss.
  EXPECT_EQ(sp.all_reduce.calls, 7);
  EXPECT_EQ(sp.all_reduce.bytes_sent, 2 * (n - 1) * (6 * c + 1) * 4 / n);

  // The parallel block fuses attention's and the MLP's projections: half the all-reduces.
  const BlockComm par = block_comm(false, n, b, t, c, /*parallel=*/true);
  EXPECT_EQ(par.all_reduce.calls, 2);
  EXPECT_EQ(par.all_reduce.bytes_sent, 2 * 2 * (n - 1) * btc / n);
}

// ------------------------------------------------------------ vocabulary parallelism

TEST(VocabParallel, CrossEntropyEqualsTheGatheredOneWithGradients) {
  const std::int64_t rows = 6, vocab = 12;
  const Tensor logits = testing::random_tensor(Key::from_seed(2), {rows, vocab});
  Tensor labels = Tensor::from_vector<std::int32_t>({0, 11, 5, 6, 3, 8}, {rows});
  TensorTree p;
  p.set("l", logits);
  auto [want, want_g] = autodiff::value_and_grad([&](const TensorTree& t) {
    return tensor::mean(tensor::cross_entropy(t.at("l"), labels));
  })(p);
  for (int n : {2, 3, 4}) {
    auto f = spmd::shard_map(
        Mesh({n}, {"model"}),
        [&](DeviceContext& ctx, const std::vector<Tensor>& in) {
          TensorTree q;
          q.set("l", in[0]);
          auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& t) {
            return tensor::mean(vocab_parallel_cross_entropy(&ctx, t.at("l"), in[1], "model"));
          })(q);
          return std::vector<Tensor>{loss, g.at("l")};
        },
        {P(std::nullopt, "model"), P()}, {P(), P(std::nullopt, "model")});
    auto out = f(std::vector<Tensor>{logits, labels});
    testing::expect_close(mesh::gather(out[0]), want, 1e-6, "loss, n=" + std::to_string(n));
    testing::expect_close(mesh::gather(out[1]), want_g.at("l"), 1e-6,
                          "gradient, n=" + std::to_string(n));
  }
}

TEST(VocabParallel, BadLabelsAndSpecsAreClearErrors) {
  auto f = spmd::shard_map(
      Mesh({2}, {"model"}),
      [&](DeviceContext& ctx, const std::vector<Tensor>& in) {
        Tensor bad = Tensor::from_vector<std::int32_t>({0, 9}, {2});
        return std::vector<Tensor>{vocab_parallel_cross_entropy(&ctx, in[0], bad, "model")};
      },
      {P(std::nullopt, "model")}, {P()});
  try {
    f(std::vector<Tensor>{Tensor::zeros({2, 8})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 9 is outside [0, 8)"), std::string::npos)
        << e.what();
  }
  // Heads not divisible by the model axis.
  const models::Transformer gpt(tiny_gpt({.layout = TPLayout::Megatron}));
  auto g = spmd::shard_map(Mesh({8}, {"model"}),
                           [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                             gpt.init(Key::from_seed(0), nullptr, &ctx);
                             return std::vector<Tensor>{};
                           },
                           {}, {});
  try {
    g(std::vector<Tensor>{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_heads=4 is not divisible by model=8"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace distjax::parallel
