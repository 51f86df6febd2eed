// The pieces the registered models are made of (app/model.hpp), for models of one's own
// too: networks as the composition takes them (app/compose.hpp) and their losses, and the
// data of Fashion-MNIST and of the text corpora.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "distjax/app/compose.hpp"
#include "distjax/app/model.hpp"
#include "distjax/data/array_dataset.hpp"
#include "distjax/data/documents.hpp"
#include "distjax/data/mix.hpp"
#include "distjax/data/text_corpus.hpp"
#include "distjax/data/token_shards.hpp"
#include "distjax/data/window_order.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/models/residual_classifier.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/models/transformer_pipeline.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/train/metrics.hpp"

namespace distjax::app {

/// A language model's mean next-position loss (nats) over `positions` positions, with its
/// metrics per position: "loss" in nats and "bits_per_<unit>" ("byte", "token") = nats / ln 2.
std::pair<tensor::Tensor, train::Metrics> per_position(tensor::Tensor mean_loss,
                                                       std::int64_t positions,
                                                       const std::string& unit = "byte");

/// A network from its forward pass: `init` runs `forward` once on an init scope over
/// `example` (a batch of one input row, e.g. Tensor::zeros({1, 784})) with the device
/// context and the fully sharded configuration the composition gives; `loss` is
/// `loss(forward(scope, batch.inputs), batch.labels)`.
///
///   app::Network net = app::network_of(
///       [](const nn::Scope& s, const Tensor& x) { return nn::Dense{.features = 10}(s.child("fc"),
///       x); }, Tensor::zeros({1, 784}));
Network network_of(
    std::function<tensor::Tensor(const nn::Scope& scope, const tensor::Tensor& inputs)> forward,
    tensor::Tensor example,
    std::function<std::pair<tensor::Tensor, train::Metrics>(const tensor::Tensor& outputs,
                                                            const tensor::Tensor& labels)>
        loss = models::classification_loss);

/// Fashion-MNIST's training and test sets from data.dir (empty: the Debian package's).
struct FashionMnist {
  data::ArrayDataset train, test;
};
FashionMnist load_fashion_mnist(const config::TrainConfig& c);

/// A classifier of Fashion-MNIST as a registered model, but for its network, description
/// and parameter count: its data (each data replica its shard of every global batch from a
/// shuffling loader seeded by run.seed), run.epochs passes when run.steps is 0, an
/// evaluation every epoch unless run.eval_every says otherwise, on each replica's equal
/// share of the test set (in batches of 1000, or of the per-replica batch when
/// `pipelined`: its micro-batches divide them), test accuracy and loss in summary.json and
/// the report.
Model fashion_mnist_model(const config::TrainConfig& c, bool pipelined = false);

/// The GPT's text as data.format says: "bytes", the text files of data.dir (empty: the
/// Debian package fortunes) split by data.validation_fraction; "tokens", the token shards
/// of data.train (or of several sources, data.sources, mixed by data.weights:
/// data::mix_rows) and data.val (data::TokenShards, raw files data.token_bytes wide), whose
/// ids model.vocab must exceed (a ConfigError naming the largest), and with data.tokenizer the
/// byte-level BPE they were made with (data::TokenizerBytes). With run.eval_batches
/// validation batches of run.batch_size windows of data.seq_len spread over the whole
/// validation split (all its windows where they fit; data::spread_windows), the same on
/// every run and mesh.
class TextData {
 public:
  /// "byte" or "token": what a position is.
  const std::string& unit() const { return unit_; }
  /// Positions of the validation split.
  std::int64_t validation_size() const;
  /// Data replica `replica` of `replicas`'s rows of the global batch of `step` (inputs and
  /// labels (B / replicas, T) i32 on the current device). The global batch holds each
  /// source's rows in turn (one source: all B), as data.order says: "random", windows at
  /// offsets drawn from key.fold_in(step) (data::sample_windows' rule; source i > 0 from
  /// that key folded with i); "epochs", the step's windows of each source's epochs
  /// (data::WindowOrder, shuffled from `key`, source i > 0 from key.fold_in(i)). With
  /// data.eot, packed documents (data::pack_documents), the validation batches too.
  train::Batch batch(std::int64_t step, int replica, int replicas, const Key& key) const;
  const std::vector<train::Batch>& validation() const { return validation_; }
  /// What the validation batches cover, for the programs' output: "all 48 windows of 64
  /// bytes of the validation split (3,073 bytes)" or "64 windows of 64 bytes spread over
  /// the validation split of 40,123 bytes (10% of its windows)".
  std::string validation_note() const;
  /// The run's header lines: where the text comes from and its size, the mix of the
  /// sources, the epochs' order.
  std::vector<std::string> describe() const;
  /// With data.tokenizer: the validation batches' positions per byte of the text their
  /// counted labels spell (counted once on the host; an end-of-text token spells none, an
  /// ignored label of packed documents counts none), so that bits per byte = bits per token
  /// * tokens_per_byte for the set as a whole (the loss sums the counted labels' losses over
  /// all positions; the batches are all the same size). 0 without a tokenizer, and for
  /// bytes (bits per token are bits per byte).
  double tokens_per_byte() const { return tokens_per_byte_; }

 private:
  friend TextData load_text(const config::TrainConfig& c);
  train::Batch windows(std::int64_t step, int replica, int replicas, const Key& key) const;
  // Packs the validation batches' documents (eot >= 0), as batch() packs the training's.
  void pack_validation(std::int64_t eot);
  // One source of training tokens and its rows of each global batch.
  struct Source {
    std::string glob;
    std::shared_ptr<const data::TokenShards> shards;
    std::int64_t rows = 0;
    std::shared_ptr<const data::WindowOrder> order{};  // data.order = "epochs"
  };
  std::string unit_ = "byte";
  std::int64_t seq_len_ = 1;
  std::string bytes_dir_;
  std::shared_ptr<const data::ByteCorpus> bytes_;
  std::shared_ptr<const data::WindowOrder> bytes_order_;
  std::vector<Source> sources_;
  std::shared_ptr<const data::TokenShards> val_;
  std::string val_glob_;
  std::int64_t batch_size_ = 1;
  std::vector<train::Batch> validation_;
  double tokens_per_byte_ = 0;
  std::int64_t eot_ = -1;
};
TextData load_text(const config::TrainConfig& c);

/// The GPT of [model] over the text of data.format (vocabulary model.vocab, 0: 256 for
/// bytes; context data.seq_len; its metrics per byte or per token), remat as
/// parallelism.remat names it; on one device (the composition lays it out over "model").
models::TransformerConfig transformer_config(const config::TrainConfig& c);
/// The MoE layer of [model.moe] (nn::MoE; its hidden width 0 stays "the model's").
nn::MoE moe_layer(const config::MoEConfig& m);

/// The MLP classifier: its init and models::classification_loss on the logits. The model must
/// outlive the spec.
Network classifier_network(const models::Classifier& model);

/// The residual classifier (models::ResidualClassifier of `config`, owned): its init,
/// models::classification_loss on the logits, and its tensor-parallel transform (the same
/// config with ResidualClassifierConfig::tp set to the composition's plan).
Network residual_classifier_network(models::ResidualClassifierConfig config);

/// The GPT: its init, its loss per position (Transformer::loss: vocabulary-parallel when its
/// layout says so; with num_classes, models::classification_loss and its accuracy) and,
/// when given, its cut into pipeline chunks. The models must outlive the network; it has
/// no tensor-parallel transform (the owning form below has).
Network transformer_network(const models::Transformer& model,
                            const models::TransformerPipeline* pipeline = nullptr);
/// The same, owning the model and its cut into pipeline chunks (the TransformerPipeline of
/// its config): Network::keep holds
/// both. Its tensor-parallel transform is the same model with TransformerConfig::tp set to
/// the composition's plan (every layout).
Network transformer_network(std::shared_ptr<const models::Transformer> model);

}  // namespace distjax::app
