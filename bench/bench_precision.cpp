// Mixed-precision benchmark (issue 10, "Precision and memory"): the bench GPT trained from
// the same initial parameters on the same batches in f32 and under the bf16 policy
// (nn::Precision::bf16(): bf16 matmuls through oneDNN's AVX-512 BF16 kernels, f32 master
// weights, f32 everything else), the two runs advancing in alternating blocks of steps so
// that both see the same machine load.
//
//   bf16_gpt_loss_vs_f32    bf16 final loss / f32 final loss after the same steps (the
//                           mean loss of the last --final steps, the same batches on both
//                           sides); baseline f32; goal within 2% (|value - 1| <= 0.02)
//   bf16_gpt_step_speedup   f32 step time / bf16 step time (median train_step times,
//                           measured in this run); > 1: bf16 is faster
//
// Usage: bench_precision [--steps N] [--final K] [--block B] [--threads T]
//   --steps N    training steps of each run (default 120)
//   --final K    steps averaged for the final loss (default 10)
//   --block B    steps per alternating block (default 5)
//   --threads T  OpenMP threads (default: the OpenMP default)
#include <CLI/CLI.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "distjax/data/text_corpus.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/train/train_step.hpp"

using namespace distjax;
using namespace distjax::bench;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

struct Options {
  int steps = 120;
  int final_steps = 10;
  int block = 5;
  int threads = 0;
};

// The bench GPT of bench_train (L4 H4 d256 T128 V256, learned positions, tied embeddings).
models::TransformerConfig bench_gpt() {
  return {.vocab = 256,
          .d_model = 256,
          .num_layers = 4,
          .num_heads = 4,
          .mlp_ratio = 4,
          .max_len = 128,
          .learned_positions = true,
          .tied_embeddings = true,
          .dropout = 0.f};
}

// The fortunes corpus when installed (text a GPT learns, so the loss moves), else bytes
// with some structure.
data::ByteCorpus corpus() {
  try {
    return data::load_fortunes();
  } catch (const Error&) {
    std::vector<std::uint8_t> bytes;
    for (int i = 0; i < 1 << 20; ++i)
      bytes.push_back(static_cast<std::uint8_t>(
          "the quick brown fox jumps over a lazy dog "[(i * 7 + i / 41) % 42]));
    return data::ByteCorpus::from_bytes(std::move(bytes));
  }
}

struct Run {
  nn::Precision precision;
  train::TrainState state;
  std::vector<double> losses, step_seconds;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App cli{"bench_precision: f32, bf16 and f16 training of the GPT"};
  cli.add_option("--steps", o.steps, "steps");
  cli.add_option("--final", o.final_steps, "steps averaged at the end");
  cli.add_option("--block", o.block, "block size");
  cli.add_option("--threads", o.threads, "OpenMP threads");
  CLI11_PARSE(cli, argc, argv);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  o.final_steps = std::max(1, std::min(o.final_steps, o.steps));
  o.block = std::max(1, o.block);

  const models::Transformer gpt(bench_gpt());
  const std::int64_t batch = 16, seq = 128;
  const data::ByteCorpus text = corpus();
  optim::AdamW opt({.learning_rate = optim::warmup_cosine_schedule(
                        0.0, 1e-3, std::min(10, o.steps - 1), o.steps, 1e-4),
                    .b1 = 0.9,
                    .b2 = 0.95,
                    .eps = 1e-8,
                    .weight_decay = 0.1});
  const TensorTree init = gpt.init(Key::from_seed(0));
  auto fresh = [&] {
    return train::TrainState::create(init.map([](const Tensor& t) { return t.clone(); }), opt,
                                     Key::from_seed(1));
  };
  std::vector<Run> runs;
  runs.push_back({nn::Precision::f32(), fresh(), {}, {}});
  runs.push_back({nn::Precision::bf16(), fresh(), {}, {}});
  const Key data_key = Key::from_seed(2);

  for (int start = 0; start < o.steps; start += o.block) {
    for (Run& r : runs) {
      const train::LossFn loss = [&gpt, p = r.precision](const TensorTree& params,
                                                         const train::Batch& b, Key k) {
        const nn::Scope s = nn::Scope::apply(&params, true, k).with_precision(p);
        return std::make_pair(gpt.loss(s, b.inputs, b.labels), train::Metrics{});
      };
      for (int i = start; i < std::min(o.steps, start + o.block); ++i) {
        const train::Batch b =
            data::sample_windows(text.train, batch, seq, data_key.fold_in(std::uint64_t(i)));
        const auto t0 = Clock::now();
        const train::Metrics m = train::train_step(r.state, b, loss, opt);
        r.step_seconds.push_back(seconds_since(t0));
        r.losses.push_back(m.mean("loss"));
      }
    }
  }

  auto final_loss = [&](const Run& r) {
    double s = 0;
    for (int i = o.steps - o.final_steps; i < o.steps; ++i)
      s += r.losses[i];
    return s / o.final_steps;
  };
  // The first steps (warm-up: primitive creation, allocator) are not timed.
  auto step_time = [&](const Run& r) {
    const std::size_t skip = std::min<std::size_t>(3, r.step_seconds.size() - 1);
    return median(std::vector<double>(r.step_seconds.begin() + skip, r.step_seconds.end()));
  };
  const double f32_loss = final_loss(runs[0]), bf16_loss = final_loss(runs[1]);
  const double f32_time = step_time(runs[0]), bf16_time = step_time(runs[1]);
  const std::string config = "L4 H4 d256 T128 V256 B16, AdamW lr 1e-3 warmup-cosine, " +
                             std::to_string(o.steps) + " steps, final loss = mean of last " +
                             std::to_string(o.final_steps) + ", threads " +
                             std::to_string(omp_get_max_threads());
  Writer out;
  json loss_line = line("bf16_gpt_loss_vs_f32", bf16_loss / f32_loss, "ratio");
  loss_line["baseline"] = "f32";
  loss_line["baseline_value"] = f32_loss;
  loss_line["bf16_final_loss"] = bf16_loss;
  loss_line["initial_loss"] = runs[0].losses.front();
  // The two runs do differ step by step (bf16 rounding changes every loss a little).
  double max_step_diff = 0;
  for (int i = 0; i < o.steps; ++i)
    max_step_diff = std::max(max_step_diff, std::abs(runs[1].losses[i] - runs[0].losses[i]));
  loss_line["max_step_loss_abs_diff"] = max_step_diff;
  loss_line["goal"] = "within 2% of 1";
  loss_line["within_goal"] = std::abs(bf16_loss / f32_loss - 1.0) <= 0.02;
  loss_line["config"] = config;
  out.write(loss_line);
  json speed = line("bf16_gpt_step_speedup", f32_time / bf16_time, "ratio");
  speed["baseline"] = "f32";
  speed["baseline_value"] = f32_time;
  speed["bf16_step_s"] = bf16_time;
  speed["f32_step_s"] = f32_time;
  speed["better"] = "higher";
  speed["ratio"] = f32_time / bf16_time;
  speed["config"] = config;
  out.write(speed);
  return 0;
}
