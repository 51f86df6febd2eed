// Token windows handed to the step by one host thread: data::sample_windows over memory-mapped
// llm.c shards (two files, so some windows cross from one into the next), against the same
// windows copied by hand from a vector of uint16 tokens in memory (the named reference, run
// alternately in the same process), GPT-2's shape (batch 8 x 1024 tokens a call).
//
//   loader_tokens_per_s_one_core   tokens (inputs and labels of a window: T each) per second;
//                                  goal >= 50M, far above what one GPU's step consumes
//
//   loader_step_wait_fraction      the share of the GPT's training loop (app::train on token
//                                  shards, data.order = "epochs") its steps waited for their
//                                  batches, made ahead on a host thread (data.prefetch), against
//                                  the same run with the step making its own (the reference);
//                                  goal <= 0.01
//
// Usage: bench_loader [--tokens N] [--batch B] [--seq T] [--seconds S] [--steps N]
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "distjax/app/train.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/data/token_shards.hpp"

using namespace distjax;

int main(int argc, char** argv) {
  std::int64_t tokens = 64 << 20, batch = 8, seq = 1024;
  double seconds = 1.0;
  std::int64_t steps = 30;
  CLI::App cli("bench_loader");
  cli.add_option("--tokens", tokens, "tokens in the shards (two files)");
  cli.add_option("--batch", batch, "windows per call");
  cli.add_option("--seq", seq, "tokens per window (T)");
  cli.add_option("--seconds", seconds, "timed seconds per side and round");
  cli.add_option("--steps", steps, "steps of each GPT run (loader_step_wait_fraction)");
  CLI11_PARSE(cli, argc, argv);

  // Shards of pseudo-random GPT-2 token ids.
  const auto dir = std::filesystem::temp_directory_path() / "distjax_bench_loader";
  std::filesystem::create_directories(dir);
  std::vector<std::uint16_t> all(static_cast<std::size_t>(tokens));
  std::uint64_t x = 88172645463325252ULL;
  for (auto& t : all) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<std::uint16_t>(x % 50257);
  }
  const std::size_t half = all.size() / 2;
  data::write_llmc_shard((dir / "train_0.bin").string(), {all.begin(), all.begin() + half});
  data::write_llmc_shard((dir / "train_1.bin").string(), {all.begin() + half, all.end()});
  const data::TokenShards shards = data::TokenShards::open((dir / "train_*.bin").string(), "bench");

  // The reference: the same windows (offsets from the same key rule) copied from memory.
  std::vector<std::int32_t> x32(static_cast<std::size_t>(batch * seq)), y32(x32.size());
  auto by_hand = [&](const Key& key) {
    const auto positions = static_cast<std::uint64_t>(tokens - seq);
    for (std::int64_t i = 0; i < batch; ++i) {
      auto w = key.bits(static_cast<std::uint64_t>(i));
      const std::uint64_t o = ((std::uint64_t{w[0]} << 32) | w[1]) % positions;
      for (std::int64_t k = 0; k < seq; ++k) {
        x32[i * seq + k] = all[o + k];
        y32[i * seq + k] = all[o + k + 1];
      }
    }
  };
  // Both sides must cut the same windows.
  const train::Batch check = data::sample_windows(shards, batch, seq, Key::from_seed(1));
  by_hand(Key::from_seed(1));
  if (check.inputs.to_vector<std::int32_t>() != x32 ||
      check.labels.to_vector<std::int32_t>() != y32) {
    std::fprintf(stderr, "bench_loader: the shards' windows differ from the reference's\n");
    return 1;
  }

  double ours = 0.0, reference = 0.0;  // best tokens per second of any round
  std::uint64_t step = 0;
  for (int round = 0; round < 3; ++round) {
    for (int side = 0; side < 2; ++side) {
      std::int64_t calls = 0;
      const auto t0 = bench::Clock::now();
      while (bench::seconds_since(t0) < seconds) {
        const Key key = Key::from_seed(7).fold_in(step++);
        if (side == 0)
          (void)data::sample_windows(shards, batch, seq, key);
        else
          by_hand(key);
        ++calls;
      }
      const double rate = static_cast<double>(calls * batch * seq) / bench::seconds_since(t0);
      (side == 0 ? ours : reference) = std::max(side == 0 ? ours : reference, rate);
    }
  }
  bench::Writer out;
  auto j = bench::line("loader_tokens_per_s_one_core", ours, "tokens/s");
  bench::compare(j, "by_hand_copy_from_memory", reference, /*higher_is_better=*/true);
  j["goal"] = 5e7;
  j["batch"] = batch;
  j["seq"] = seq;
  j["shard_tokens"] = tokens;
  j["note"] =
      "windows of two memory-mapped llm.c shards (page cache warm) against the same "
      "windows copied from a uint16 vector; best of 3 alternating rounds";
  out.write(j);

  // The GPT's loop on shards of the same layout (ids below its vocabulary of 1024), with
  // and without the host thread, alternately; the least waiting of two runs each.
  for (auto& t : all) t %= 1024;
  data::write_llmc_shard((dir / "gpt_train.bin").string(), {all.begin(), all.end() - (1 << 20)});
  data::write_llmc_shard((dir / "gpt_val.bin").string(), {all.end() - (1 << 20), all.end()});
  auto wait_fraction = [&](bool prefetch) {
    config::TrainConfig c;
    c.run.program = "gpt";
    c.run.steps = steps;
    c.run.batch_size = 8;
    c.run.log_every = steps;
    c.run.eval_batches = 1;
    c.run.checkpoint_every = 0;
    c.run.out_dir = (dir / "run").string();
    c.run.overwrite = true;
    c.model.vocab = 1024;
    c.model.layers = 2;
    c.model.d_model = 128;
    c.model.heads = 4;
    c.model.dropout = 0.0;
    c.data.format = "tokens";
    c.data.train = (dir / "gpt_train.bin").string();
    c.data.val = (dir / "gpt_val.bin").string();
    c.data.seq_len = 256;
    c.data.order = "epochs";
    c.data.prefetch = prefetch;
    if (app::train(c) != 0) throw std::runtime_error("bench_loader: the GPT run failed");
    std::ifstream f(dir / "run" / "summary.json");
    return nlohmann::json::parse(f)["data_wait_fraction"].get<double>();
  };
  double ahead = 1.0, by_step = 1.0;
  for (int round = 0; round < 2; ++round) {
    ahead = std::min(ahead, wait_fraction(true));
    by_step = std::min(by_step, wait_fraction(false));
  }
  std::filesystem::remove_all(dir);
  auto w = bench::line("loader_step_wait_fraction", ahead, "fraction");
  bench::compare(w, "batches_made_by_the_step", by_step, /*higher_is_better=*/false);
  w["goal"] = 0.01;
  w["steps"] = steps;
  w["note"] =
      "share of the GPT's training loop (one device, L2 C128 T256 B8, token shards, epochs "
      "order) its steps waited for their batches; least of 2 runs per side";
  out.write(w);
  return 0;
}
