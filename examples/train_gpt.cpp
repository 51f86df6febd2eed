// Trains the GPT-style Transformer on a byte-level corpus (the Debian fortune files)
// on one device, reporting validation loss in bits per byte, and writes
// metrics.jsonl and summary.json into --out. The flags fill the config of
// configs/train_gpt.toml (program examples/programs/train_gpt.cpp).
//
//   ./build/train_gpt --out runs/gpt [--steps 600 --batch-size 16 --seq-len 64 --d-model 128]
#include "distjax/data/text_corpus.hpp"
#include "example_args.hpp"
#include "example_common.hpp"
#include "programs/programs.hpp"

using namespace distjax;

int main(int argc, char** argv) {
  return examples::run_main("train_gpt", [&] {
    config::TrainConfig c = examples::program_defaults("train_gpt");
    c.data.dir = data::kFortunesDir;
    examples::Args args("train_gpt",
                        "trains a byte-level GPT on the fortune files (single device)");
    args.bind("out", &c.run.out_dir, "output directory");
    args.bind("overwrite", &c.run.overwrite,
              "1 = start afresh over the checkpoints in --out, removing them");
    args.bind("steps", &c.run.steps, "optimizer steps");
    args.bind("batch-size", &c.run.batch_size, "sequences per step");
    args.bind("seq-len", &c.data.seq_len, "bytes per sequence (T)");
    args.bind("d-model", &c.model.d_model, "model width (C)");
    args.bind("layers", &c.model.layers, "transformer blocks (L)");
    args.bind("heads", &c.model.heads, "attention heads (H)");
    args.bind("lr", &c.optimizer.lr, "peak learning rate of AdamW");
    args.bind("weight-decay", &c.optimizer.weight_decay, "AdamW decoupled weight decay");
    args.bind("warmup-steps", &c.optimizer.warmup_steps, "linear warmup steps");
    args.bind("minibatches", &c.run.grad_accum_steps, "gradient-accumulation slices per step");
    args.bind("eval-every", &c.run.eval_every, "steps between validation evaluations");
    args.bind("eval-batches", &c.run.eval_batches, "validation batches per evaluation");
    args.bind("log-every", &c.run.log_every, "steps between progress lines");
    args.bind("seed", &c.run.seed, "seed of initialisation and batch sampling");
    args.bind("data", &c.data.dir, "directory of text files");
    args.parse(argc, argv);
    return examples::run_program(c);
  });
}
