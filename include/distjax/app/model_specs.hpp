// The programs' models as the composition takes them (app/compose.hpp), and their losses
// with the metrics they report.
#pragma once

#include <utility>

#include "distjax/app/compose.hpp"
#include "distjax/data/array_dataset.hpp"
#include "distjax/data/text_corpus.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/models/transformer_pipeline.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/train/metrics.hpp"

namespace distjax::app {

/// A language model's mean next-byte loss (nats) over `bytes` positions, with its metrics per
/// byte: "loss" in nats and "bits_per_byte" = nats / ln 2.
std::pair<tensor::Tensor, train::Metrics> per_byte(tensor::Tensor mean_loss, std::int64_t bytes);

/// Fashion-MNIST's training and test sets from data.dir (empty: the Debian package's).
struct FashionMnist {
  data::ArrayDataset train, test;
};
FashionMnist load_fashion_mnist(const config::TrainConfig& c);

/// The fortune files from data.dir (empty: the Debian package's), split by
/// data.validation_fraction, and run.eval_batches validation batches of run.batch_size
/// windows of data.seq_len bytes.
struct Fortunes {
  data::ByteCorpus corpus;
  std::vector<train::Batch> validation;
};
Fortunes load_fortunes(const config::TrainConfig& c);

/// The GPT of [model] over bytes (vocabulary 256, context data.seq_len), remat as
/// parallelism.remat names it, tensor parallel as `tp` says.
models::TransformerConfig transformer_config(const config::TrainConfig& c,
                                             models::TransformerTP tp = {});

/// The MLP classifier: its init and models::classification_loss on the logits. The model must
/// outlive the spec.
ModelSpec classifier_spec(const models::Classifier& model);

/// The GPT: its init, its loss per byte (Transformer::loss: vocabulary-parallel when its
/// layout says so) and, when given, its cut into pipeline chunks. The models must outlive
/// the spec.
ModelSpec transformer_spec(const models::Transformer& model,
                           const models::TransformerPipeline* pipeline = nullptr);

}  // namespace distjax::app
