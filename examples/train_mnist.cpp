// The main job of DistJax (`make run`): trains the MLP Classifier on Fashion-MNIST on
// one device with AdamW and a warmup + cosine learning-rate schedule, evaluates on the
// test set after every epoch, and writes metrics.jsonl and summary.json into --out.
//
//   ./build/train_mnist --out runs/mnist [--epochs 10 --batch-size 128 --lr 2e-3 --seed 0]
#include <cmath>
#include <cstdio>
#include <exception>

#include "distjax/data/fashion_mnist.hpp"
#include "distjax/data/loader.hpp"
#include "distjax/models/classifier.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/trainer.hpp"
#include "example_args.hpp"

using namespace distjax;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

// Number of rows where argmax(logits) == label.
double count_correct(const Tensor& logits, const Tensor& labels) {
  const auto pred = tensor::argmax(logits.detach(), -1).to_vector<std::int64_t>();
  const std::int32_t* y = labels.data<std::int32_t>();
  double correct = 0;
  for (std::size_t i = 0; i < pred.size(); ++i)
    correct += pred[i] == y[i];
  return correct;
}

// Loss function of the classifier: mean cross-entropy, plus accuracy as (correct, B).
train::LossFn make_loss(const models::Classifier& model, bool train) {
  return [&model, train](const TensorTree& params, const train::Batch& batch, Key rng) {
    Tensor logits = model.apply(params, batch.inputs, train, rng);
    Tensor loss = tensor::mean(tensor::cross_entropy(logits, batch.labels));
    train::Metrics m;
    m.add("accuracy", count_correct(logits, batch.labels), static_cast<double>(batch.size()));
    return std::make_pair(loss, m);
  };
}

int run(int argc, char** argv) {
  examples::Args args("train_mnist", "trains the MLP classifier on Fashion-MNIST (single device)");
  std::string& out = args.flag("out", std::string("runs/mnist"), "output directory");
  long long& epochs = args.flag("epochs", 10LL, "passes over the 60,000 training images");
  long long& batch_size = args.flag("batch-size", 128LL, "examples per step");
  double& lr = args.flag("lr", 2e-3, "peak learning rate of AdamW");
  double& weight_decay = args.flag("weight-decay", 1e-4, "AdamW decoupled weight decay");
  long long& hidden = args.flag("hidden", 512LL, "hidden units of the MLP");
  double& dropout = args.flag("dropout", 0.1, "dropout rate after the hidden layer");
  long long& warmup = args.flag("warmup-steps", 200LL, "linear warmup steps");
  long long& log_every = args.flag("log-every", 100LL, "steps between progress lines");
  long long& seed = args.flag("seed", 0LL, "seed of initialisation, shuffling and dropout");
  std::string& data_dir = args.flag("data", std::string(data::kFashionMnistDir),
                                    "directory of the Fashion-MNIST IDX files");
  args.parse(argc, argv);

  std::printf("Loading Fashion-MNIST from %s\n", data_dir.c_str());
  data::ArrayDataset train_set = data::load_fashion_mnist(data::Split::Train, data_dir);
  data::ArrayDataset test_set = data::load_fashion_mnist(data::Split::Test, data_dir);
  data::DataLoader loader(train_set,
                          {.batch_size = batch_size, .seed = static_cast<std::uint64_t>(seed)});
  const std::vector<train::Batch> test_batches = test_set.batches(1000);

  models::Classifier model({.in_features = 784,
                            .hidden = hidden,
                            .num_classes = 10,
                            .dropout = static_cast<float>(dropout)});
  const std::int64_t steps_per_epoch = loader.batches_per_epoch();
  const std::int64_t total_steps = epochs * steps_per_epoch;
  optim::AdamW opt(
      {.learning_rate = optim::warmup_cosine_schedule(
           0.0, lr, std::min<std::int64_t>(warmup, total_steps - 1), total_steps, lr * 0.01),
       .weight_decay = weight_decay,
       .decay_mask = optim::default_decay_mask()});
  const Key root = Key::from_seed(static_cast<std::uint64_t>(seed));
  train::TrainState state =
      train::TrainState::create(model.init(root.fold_in(std::string_view("init"))), opt,
                                root.fold_in(std::string_view("dropout")));
  std::printf(
      "Classifier 784-%lld-10: %lld parameters | train %lld, test %lld images | %lld epochs x %lld "
      "steps, batch %lld\n",
      static_cast<long long>(hidden), static_cast<long long>(state.params.num_elements()),
      static_cast<long long>(train_set.size()), static_cast<long long>(test_set.size()), epochs,
      static_cast<long long>(steps_per_epoch), batch_size);

  const train::LossFn train_loss = make_loss(model, true);
  const train::LossFn eval_loss = make_loss(model, false);
  train::Trainer trainer({.out_dir = out, .total_steps = total_steps, .log_every = log_every}, opt,
                         train_loss);
  for (long long e = 0; e < epochs; ++e) {
    for (std::int64_t s = 0; s < steps_per_epoch; ++s)
      trainer.step(state, loader.next());
    trainer.evaluate(state, test_batches, eval_loss);
  }
  const double acc = trainer.last_eval().at("accuracy");
  const double loss = trainer.last_eval().at("loss");
  trainer.finish(state, {{"test_accuracy", acc},
                         {"test_loss", loss},
                         {"epochs", double(epochs)},
                         {"batch_size", double(batch_size)}});
  std::printf("Final test accuracy: %.2f%% (loss %.4f) after %lld epochs\n", 100.0 * acc, loss,
              epochs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mnist: %s\n", e.what());
    return 1;
  }
}
