// The programs' models as the composition takes them (app/compose.hpp), and their losses
// with the metrics they report.
#pragma once

#include <utility>

#include "distjax/app/compose.hpp"
#include "distjax/data/array_dataset.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/models/transformer_pipeline.hpp"
#include "distjax/tensor/tensor.hpp"
#include "distjax/train/metrics.hpp"

namespace distjax::app {

/// Mean cross-entropy of logits (B, K) against i32 labels (B), with "accuracy" as
/// (rows where argmax == label, B).
std::pair<tensor::Tensor, train::Metrics> classification_loss(const tensor::Tensor& logits,
                                                              const tensor::Tensor& labels);

/// A language model's mean next-byte loss (nats) over `bytes` positions, with its metrics per
/// byte: "loss" in nats and "bits_per_byte" = nats / ln 2.
std::pair<tensor::Tensor, train::Metrics> per_byte(tensor::Tensor mean_loss, std::int64_t bytes);

/// Fashion-MNIST's training and test sets from data.dir (empty: the Debian package's).
struct FashionMnist {
  data::ArrayDataset train, test;
};
FashionMnist load_fashion_mnist(const config::TrainConfig& c);

/// The MLP classifier: its init and its classification_loss on the logits. The model must
/// outlive the spec.
ModelSpec classifier_spec(const models::Classifier& model);

/// The GPT: its init, its loss per byte (Transformer::loss: vocabulary-parallel when its
/// layout says so) and, when given, its cut into pipeline chunks. The models must outlive
/// the spec.
ModelSpec transformer_spec(const models::Transformer& model,
                           const models::TransformerPipeline* pipeline = nullptr);

}  // namespace distjax::app
