#include "distjax/app/networks.hpp"

#include "distjax/core/error.hpp"

#include <cstdio>
#include <numbers>
#include <sstream>

#include "distjax/app/run.hpp"
#include "distjax/data/fashion_mnist.hpp"
#include "distjax/data/tokenizer.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::app {

std::pair<tensor::Tensor, train::Metrics> per_position(tensor::Tensor mean_loss,
                                                       std::int64_t positions,
                                                       const std::string& unit) {
  const auto n = static_cast<double>(positions);
  train::Metrics m;  // read when reported: no host wait here
  m.add("loss", mean_loss, n, n);
  m.add("bits_per_" + unit, mean_loss, n / std::numbers::ln2, n);
  return {std::move(mean_loss), m};
}

FashionMnist load_fashion_mnist(const config::TrainConfig& c) {
  const std::string dir = c.data.dir.empty() ? data::kFashionMnistDir : c.data.dir;
  return {data::load_fashion_mnist(data::Split::Train, dir),
          data::load_fashion_mnist(data::Split::Test, dir)};
}

Model fashion_mnist_model(const config::TrainConfig& c, bool pipelined) {
  const auto mnist = std::make_shared<const FashionMnist>(load_fashion_mnist(c));
  const std::int64_t batch = c.run.batch_size;
  const auto seed = static_cast<std::uint64_t>(c.run.seed);
  const std::int64_t per_epoch =
      data::DataLoader(mnist->train, {.batch_size = batch}).batches_per_epoch();
  Model m;
  m.total_steps = c.run.steps > 0 ? c.run.steps : c.run.epochs * per_epoch;
  m.eval_every = c.run.eval_every > 0 ? c.run.eval_every : per_epoch;
  m.header = {"Fashion-MNIST from " +
              (c.data.dir.empty() ? std::string(data::kFashionMnistDir) : c.data.dir) + ": " +
              std::to_string(mnist->train.size()) + " training, " +
              std::to_string(mnist->test.size()) + " test images; " + std::to_string(per_epoch) +
              " steps per epoch"};
  m.data = [mnist, batch, seed, pipelined](const DevicePlace& p) {
    DeviceData d;
    d.loader = std::make_shared<data::DataLoader>(
        mnist->train,
        data::LoaderConfig{
            .batch_size = batch, .seed = seed, .num_shards = p.replicas, .shard_index = p.replica});
    d.batch = [loader = d.loader.get()](std::int64_t) { return loader->next(); };
    // Every replica the same number of test batches: a fully sharded forward is collective.
    const std::int64_t rows = pipelined ? batch / p.replicas : 1000;
    std::int64_t share = mnist->test.size() / p.replicas;
    if (pipelined) share = share / rows * rows;
    const std::int64_t begin = p.replica * share;
    for (std::int64_t at = begin; at < begin + share; at += rows)
      d.eval.push_back(mnist->test.slice(at, std::min(at + rows, begin + share)));
    return d;
  };
  const double epochs = static_cast<double>(m.total_steps) / static_cast<double>(per_epoch);
  m.summary = [epochs](const RunResult& r) -> std::map<std::string, double> {
    return {{"test_accuracy", r.eval.mean("accuracy")},
            {"test_loss", r.eval.mean("loss")},
            {"epochs", epochs}};
  };
  m.report = [epochs](const RunResult& r, const train::TrainState&, const DevicePlace&) {
    char line[160];
    std::snprintf(line, sizeof line,
                  "Test accuracy: %.2f%% (%lld images, loss %.4f) after %.3g epochs\n",
                  100.0 * r.eval.mean("accuracy"),
                  static_cast<long long>(r.eval.at("accuracy").count), r.eval.mean("loss"), epochs);
    return std::string(line);
  };
  return m;
}

Network network_of(
    std::function<tensor::Tensor(const nn::Scope& scope, const tensor::Tensor& inputs)> forward,
    tensor::Tensor example,
    std::function<std::pair<tensor::Tensor, train::Metrics>(const tensor::Tensor& outputs,
                                                            const tensor::Tensor& labels)>
        loss) {
  Network n;
  n.init = [forward, example](Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                              const nn::FullySharded* fsdp) {
    return nn::init_parameters(key, specs, ctx, fsdp,
                               [&](const nn::Scope& scope) { forward(scope, example); });
  };
  n.loss = [forward, loss](const nn::Scope& scope, const train::Batch& batch) {
    return loss(forward(scope, batch.inputs), batch.labels);
  };
  return n;
}

std::int64_t TextData::validation_size() const {
  return bytes_ ? static_cast<std::int64_t>(bytes_->validation.size()) : val_->size();
}

std::string TextData::validation_note() const {
  const std::int64_t split = validation_size();
  const std::int64_t all = (split - 1) / seq_len_;
  const std::int64_t batch = validation_.empty() ? 1 : validation_[0].size();
  const std::int64_t taken = static_cast<std::int64_t>(validation_.size()) * batch;
  const std::string unit = unit_ + "s";
  std::ostringstream os;
  if (taken == all / batch * batch)
    os << "all " << taken << " windows of " << seq_len_ << " " << unit
       << " of the validation split (" << split << " " << unit << ")";
  else
    os << taken << " windows of " << seq_len_ << " " << unit
       << " spread over the validation split of " << split << " " << unit << " ("
       << (100 * taken + all / 2) / all << "% of its windows)";
  return os.str();
}

std::vector<std::string> TextData::describe() const {
  const auto order_line = [](const data::WindowOrder& o, const std::string& of) {
    return "Order" + of + ": epochs of " + std::to_string(o.windows()) + " windows, " +
           std::to_string(o.batches_per_epoch()) + " global batches each, shuffled by run.seed";
  };
  std::vector<std::string> lines;
  if (bytes_) {
    lines.push_back("Corpus " + bytes_dir_ + ": " + std::to_string(bytes_->train.size()) +
                    " train / " + std::to_string(bytes_->validation.size()) +
                    " validation bytes");
    if (bytes_order_) lines.push_back(order_line(*bytes_order_, ""));
    return lines;
  }
  if (sources_.size() == 1) {
    const Source& s = sources_[0];
    lines.push_back("Corpus " + s.glob + " / " + val_glob_ + ": " +
                    std::to_string(s.shards->size()) + " train / " +
                    std::to_string(val_->size()) + " validation tokens");
    if (s.order) lines.push_back(order_line(*s.order, ""));
    return lines;
  }
  lines.push_back("Corpus: " + std::to_string(sources_.size()) + " sources mixed / " +
                  val_glob_ + ": " + std::to_string(val_->size()) + " validation tokens");
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    const Source& s = sources_[i];
    char share[96];
    std::snprintf(share, sizeof share, ": %lld train tokens, %lld of %lld rows (%.1f%%)",
                  static_cast<long long>(s.shards->size()), static_cast<long long>(s.rows),
                  static_cast<long long>(batch_size_), 100.0 * s.rows / batch_size_);
    lines.push_back("  source " + std::to_string(i) + " " + s.glob + share);
    if (s.order) lines.push_back("  " + order_line(*s.order, " of source " + std::to_string(i)));
  }
  return lines;
}

train::Batch TextData::batch(std::int64_t step, int replica, int replicas, const Key& key) const {
  train::Batch b = windows(step, replica, replicas, key);
  return eot_ >= 0 ? data::pack_documents(b, eot_) : b;
}

train::Batch TextData::windows(std::int64_t step, int replica, int replicas, const Key& key) const {
  const Key step_key = key.fold_in(static_cast<std::uint64_t>(step));
  if (bytes_) {
    if (bytes_order_)
      return data::windows_at(bytes_->train, bytes_order_->starts(step, replica, replicas),
                              seq_len_);
    const train::Batch b = data::sample_windows(bytes_->train, batch_size_, seq_len_, step_key);
    return replicas > 1 ? replica_slice(b, replica, replicas) : b;
  }
  // The global batch's windows, source after source; this replica reads only its rows.
  std::vector<data::SourceWindow> rows;
  std::vector<const data::TokenShards*> shards;
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    const Source& s = sources_[i];
    shards.push_back(s.shards.get());
    const std::vector<std::int64_t> starts =
        s.order ? s.order->starts(step)
                : data::random_starts(*s.shards, s.rows, seq_len_,
                                      i == 0 ? step_key : step_key.fold_in(i));
    for (std::int64_t start : starts)
      rows.push_back({i, start});
  }
  const std::int64_t per = batch_size_ / replicas;
  return data::windows_at(
      shards, {rows.begin() + replica * per, rows.begin() + (replica + 1) * per}, seq_len_);
}

void TextData::pack_validation(std::int64_t eot) {
  eot_ = eot;
  if (eot < 0) return;
  for (train::Batch& b : validation_)
    b = data::pack_documents(b, eot);
}

namespace {

// The epochs' order of a split of files of `positions` each, read `rows` windows a step
// (data.order = "epochs"; file by file), shuffled from `key`; else null.
std::shared_ptr<const data::WindowOrder> order_of(const config::TrainConfig& c,
                                                  const std::vector<std::int64_t>& positions,
                                                  std::int64_t rows, const Key& key) {
  if (c.data.order != "epochs") return nullptr;
  return std::make_shared<const data::WindowOrder>(positions, c.data.seq_len, rows, key);
}

std::vector<std::int64_t> file_positions(const data::TokenShards& shards) {
  std::vector<std::int64_t> out;
  for (const data::TokenFile& f : shards.files())
    out.push_back(f.tokens);
  return out;
}

// The validation batches' positions per byte of text their counted labels spell
// (data.tokenizer): the loss is a sum over the counted labels per position.
// `largest`: the largest token of this process's share of data.val.
double tokens_per_byte(const std::string& tokenizer, const data::TokenShards& val,
                       std::int64_t largest, const std::vector<train::Batch>& validation) {
  const data::TokenizerBytes tok = data::TokenizerBytes::load(tokenizer);
  DISTJAX_CHECK(largest < tok.vocab_size(), ConfigError, "[config] data.tokenizer \"", tokenizer,
                "\" has ", tok.vocab_size(), " ids but ", val.key(), " holds token ", largest,
                ": the shards were made with another tokenizer");
  std::int64_t tokens = 0, bytes = 0;
  for (const train::Batch& b : validation)
    for (const std::int32_t id : b.labels.to_vector<std::int32_t>()) {
      if (id != train::kIgnoreLabel) bytes += tok.bytes(id);
      ++tokens;
    }
  DISTJAX_CHECK(bytes > 0, ConfigError, "[config] the validation labels spell no byte of text "
                "with data.tokenizer \"", tokenizer, "\"");
  return static_cast<double>(tokens) / static_cast<double>(bytes);
}

}  // namespace

TextData load_text(const config::TrainConfig& c) {
  TextData t;
  t.batch_size_ = c.run.batch_size;
  t.seq_len_ = c.data.seq_len;
  const Key key =
      Key::from_seed(static_cast<std::uint64_t>(c.run.seed)).fold_in(std::string_view("data"));
  if (c.data.format != "tokens") {
    DISTJAX_CHECK(c.data.sources.empty(), ConfigError,
                  "[config] data.sources mixes token shards: it needs data.format = \"tokens\"");
    t.bytes_dir_ = c.data.dir.empty() ? data::kFortunesDir : c.data.dir;
    t.bytes_ = std::make_shared<const data::ByteCorpus>(
        data::load_fortunes(t.bytes_dir_, c.data.validation_fraction));
    t.validation_ = data::spread_windows(t.bytes_->validation, c.run.batch_size, c.data.seq_len,
                                         c.run.eval_batches);
    t.bytes_order_ =
        order_of(c, {static_cast<std::int64_t>(t.bytes_->train.size())}, c.run.batch_size, key);
    t.pack_validation(c.data.eot);
    return t;
  }
  t.unit_ = "token";
  const int width = static_cast<int>(c.data.token_bytes);
  DISTJAX_CHECK(c.data.sources.empty() || c.data.train.empty(), ConfigError,
                "[config] data.train and data.sources both name training shards: give one (a "
                "glob, or several to mix by data.weights)");
  DISTJAX_CHECK(c.data.weights.empty() || c.data.weights.size() == c.data.sources.size(),
                ConfigError, "[config] data.weights has ", c.data.weights.size(),
                " weights for ", c.data.sources.size(), " data.sources: one each (or none: equal)");
  const std::vector<std::string> globs =
      c.data.sources.empty() ? std::vector<std::string>{c.data.train} : c.data.sources;
  std::vector<std::int64_t> weights(c.data.weights.begin(), c.data.weights.end());
  weights.resize(globs.size(), 1);
  std::vector<std::int64_t> rows;
  try {
    rows = data::mix_rows(weights, c.run.batch_size);
  } catch (const InvalidArgument& e) {
    throw ConfigError(std::string("[config] data.weights: ") + e.what());
  }
  for (std::size_t i = 0; i < globs.size(); ++i) {
    const std::string name =
        c.data.sources.empty() ? "data.train" : "data.sources[" + std::to_string(i) + "]";
    TextData::Source s{.glob = globs[i],
                       .shards = std::make_shared<const data::TokenShards>(
                           data::TokenShards::open(globs[i], name, width)),
                       .rows = rows[i]};
    s.order = order_of(c, file_positions(*s.shards), s.rows, i == 0 ? key : key.fold_in(i));
    t.sources_.push_back(std::move(s));
  }
  t.val_glob_ = c.data.val;
  t.val_ = std::make_shared<const data::TokenShards>(
      data::TokenShards::open(c.data.val, "data.val", width));
  // Every token below the vocabulary, checked before the first step. Each process checks
  // its share of each split's files (all of them in one process), so that under MPI no
  // process reads every shard; one that finds a token past the vocabulary fails the launch
  // with this message.
  const auto parts = static_cast<std::size_t>(std::max(1, c.distributed.launched_processes));
  const auto part = static_cast<std::size_t>(c.distributed.rank) % parts;
  std::vector<const data::TokenShards*> splits = {t.val_.get()};
  for (const TextData::Source& s : t.sources_)
    splits.push_back(s.shards.get());
  std::int64_t val_largest = -1;
  for (const data::TokenShards* split : splits) {
    const data::TokenShards::Largest top = split->largest_token(part, parts);
    if (split == t.val_.get()) val_largest = top.token;
    DISTJAX_CHECK(top.token < c.model.vocab, ConfigError, "[config] model.vocab = ",
                  c.model.vocab, ": ", split->key(), " holds token ", top.token, " (in ",
                  split->files()[top.file].path, "); the vocabulary must be above every token ("
                  "model.vocab >= ", top.token + 1, ")");
  }
  t.validation_ =
      data::spread_windows(*t.val_, c.run.batch_size, c.data.seq_len, c.run.eval_batches);
  t.pack_validation(c.data.eot);
  if (!c.data.tokenizer.empty())
    t.tokens_per_byte_ =
        tokens_per_byte(c.data.tokenizer, *t.val_, val_largest, t.validation_);
  return t;
}

models::TransformerConfig transformer_config(const config::TrainConfig& c) {
  // Byte corpora need 256 ids; a larger vocabulary (e.g. GPT-2's 50304, to train that
  // shape) leaves the rows above 255 unused by the data. Token shards name their own.
  const bool tokens = c.data.format == "tokens";
  DISTJAX_CHECK(tokens || c.model.vocab == 0 || c.model.vocab >= 256, ConfigError,
                "[config] model.vocab = ", c.model.vocab,
                ": the byte corpora need at least 256 ids (0 = 256)");
  DISTJAX_CHECK(!tokens || c.model.vocab > 0, ConfigError,
                "[config] data.format = \"tokens\" needs model.vocab (above the shards' largest "
                "token)");
  return {.vocab = c.model.vocab > 0 ? c.model.vocab : 256,
          .d_model = c.model.d_model,
          .num_layers = c.model.layers,
          .num_heads = c.model.heads,
          .max_len = c.data.seq_len,
          .tied_embeddings = c.model.tie_embeddings,
          .dropout = static_cast<float>(c.model.dropout),
          // with FSDP: a block's gathered weights live only while it runs
          .remat = remat_of(c, "Block"),
          .remat_attn = remat_of(c, "Attn"),
          .remat_mlp = remat_of(c, "MLP"),
          .unit = tokens ? "token" : "byte",
          .document_attention = c.data.document_attention,
          .moe_every = c.model.moe.experts > 0 ? c.model.moe.every : 0,
          .moe = moe_layer(c.model.moe)};
}

nn::MoE moe_layer(const config::MoEConfig& m) {
  return {.num_experts = std::max<std::int64_t>(m.experts, 1),
          .top_k = m.top_k,
          .hidden = m.hidden,
          .swiglu = m.activation == "swiglu",
          .capacity_factor = m.capacity_factor,
          .drop_by_probability = m.drop == "probability",
          .renormalize = m.renormalize,
          .shared_experts = m.shared_experts,
          .aux_loss_coef = m.aux_loss_coef,
          .z_loss_coef = m.z_loss_coef,
          .balance_bias_rate = m.balance_bias_rate,
          .dispatcher = m.dispatcher == "all_gather" ? nn::MoE::Dispatcher::AllGather
                                                     : nn::MoE::Dispatcher::AllToAll,
          .exchange_chunks = m.exchange_chunks,
          .tensor_axis = m.expert_tensor_parallel ? "model" : ""};
}

Network classifier_network(const models::Classifier& model) {
  return {
      .init = [&model](Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                       const nn::FullySharded* fsdp) { return model.init(key, specs, ctx, fsdp); },
      .loss =
          [&model](const nn::Scope& scope, const train::Batch& batch) {
            return models::classification_loss(model(scope, batch.inputs), batch.labels);
          }};
}

Network residual_classifier_network(models::ResidualClassifierConfig config) {
  const auto model = std::make_shared<const models::ResidualClassifier>(config);
  return {
      .init = [model](Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                      const nn::FullySharded* fsdp) { return model->init(key, specs, ctx, fsdp); },
      .loss =
          [model](const nn::Scope& scope, const train::Batch& batch) {
            return models::classification_loss((*model)(scope, batch.inputs), batch.labels);
          },
      .keep = model,
      .tensor_parallel =
          [config](const parallel::TPPlan& tp) {
            models::ResidualClassifierConfig laid = config;
            laid.tp = tp;
            return residual_classifier_network(laid);
          }};
}

Network transformer_network(const models::Transformer& model,
                            const models::TransformerPipeline* pipeline) {
  return {
      .init = [&model](Key key, nn::ParamSpecs* specs, spmd::DeviceContext* ctx,
                       const nn::FullySharded* fsdp) { return model.init(key, specs, ctx, fsdp); },
      .loss =
          [&model](const nn::Scope& scope, const train::Batch& batch) {
            if (model.config().num_classes > 0)
              return models::classification_loss(model(scope, batch.inputs), batch.labels);
            // MoE layers add their balancing losses in the backward pass and sow their
            // statistics: the loss metrics are the cross-entropy's alone.
            nn::Sown sown;
            const tensor::Tensor objective =
                model.loss(scope.sowing(&sown), batch.inputs, batch.labels, batch.documents);
            auto [loss, metrics] =
                per_position(objective, batch.labels.numel(), model.config().unit);
            if (const double r = model.config().tokens_per_byte; r > 0) {
              const auto n = static_cast<double>(batch.labels.numel());
              metrics.add("bits_per_byte", loss, n * r / std::numbers::ln2, n);
            }
            // Each MoE layer's statistic counts once (their mean over layers and devices);
            // the balancing biases' loads are summed with the metrics for after_update.
            models::add_moe_metrics(sown, metrics);
            return std::make_pair(std::move(loss), metrics);
          },
      .pipeline = pipeline};
}

Network transformer_network(std::shared_ptr<const models::Transformer> model) {
  auto stages = std::make_shared<const models::TransformerPipeline>(model->config());
  Network n = transformer_network(*model, stages.get());
  n.tensor_parallel = [config = model->config()](const parallel::TPPlan& tp) {
    models::TransformerConfig laid = config;
    laid.tp = tp;
    return transformer_network(std::make_shared<const models::Transformer>(std::move(laid)));
  };
  if (model->config().num_classes == 0 && model->config().input_features == 0)
    n.context_parallel = [config = model->config()](const parallel::ContextPlan& cp) {
      models::TransformerConfig split = config;
      split.cp = cp;
      return transformer_network(std::make_shared<const models::Transformer>(std::move(split)));
    };
  if (const models::TransformerConfig& c = model->config();
      c.moe_layers() > 0 && c.moe.balance_bias_rate > 0)
    n.after_update = [c](tensor::TensorTree& params, const train::Metrics& step) {
      models::moe_balance_biases(c, params, step);
    };
  n.keep = std::make_shared<std::pair<decltype(model), decltype(stages)>>(std::move(model),
                                                                          std::move(stages));
  return n;
}

}  // namespace distjax::app
