// Trains the GPT-style Transformer on a byte-level corpus (the Debian fortune files) on
// one device, reporting validation loss in bits per byte and a sample of generated text,
// and writes metrics.jsonl and summary.json into --out. The model is "gpt" on one device.
//
//   ./build/train_gpt --out runs/gpt [--steps 600 --batch-size 16 --seq-len 64 --d-model 128]
#include "example_main.hpp"

int main(int argc, char** argv) {
  return distjax::examples::example_main(
      argc, argv,
      {.name = "train_gpt",
       .about = "trains a byte-level GPT on the fortune files (single device)",
       .flags = {{"steps", "run.steps", "optimizer steps"},
                 {"batch-size", "run.batch_size", "sequences per step"},
                 {"seq-len", "data.seq_len", "bytes per sequence (T)"},
                 {"d-model", "model.d_model", "model width (C)"},
                 {"layers", "model.layers", "transformer blocks (L)"},
                 {"heads", "model.heads", "attention heads (H)"},
                 {"lr", "optimizer.lr", "peak learning rate of AdamW"},
                 {"weight-decay", "optimizer.weight_decay", "AdamW decoupled weight decay"},
                 {"warmup-steps", "optimizer.warmup_steps", "linear warmup steps"},
                 {"minibatches", "run.grad_accum_steps", "gradient-accumulation slices per step"},
                 {"eval-every", "run.eval_every", "steps between validation evaluations"},
                 {"eval-batches", "run.eval_batches", "validation batches per evaluation"},
                 {"log-every", "run.log_every", "steps between progress lines"},
                 {"seed", "run.seed", "seed of initialisation and batch sampling"},
                 {"data", "data.dir", "directory of text files"}}});
}
