// GPT-2 124M training on one GPU through the CUDA backend: L12 H12 d768 T1024 V50304 (tied
// head, learned positions), bf16 matmuls with f32 master weights (nn::Precision::bf16()),
// AdamW (lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every parameter), random
// tokens (one batch, every step), as bench/reference/torch_gpt2.py and jax_gpt2.py train
// it. Prints one JSON line (gpu_gpt2_124m_tokens_per_s) with the median step after warm-up,
// the MFU (6N + 12 L H Q T FLOPs per token against 989 TFLOP/s) and the peak device memory;
// DISTJAX_BENCH_OUT appends it to a file.
//   bench_gpu_gpt2 [--batch 16] [--steps 20] [--warmup 3] [--precision bf16|f32]
//                  [--layers 12] [--seq 1024] [--device cuda] [--profile-steps 2]
//                  [--bf16-attention 1] [--loss-steps 20] [--weights-out PATH]
//                  [--tokens-out PATH]
// then one line per op (gpu_gpt2_124m_op_time: device ms per step, the 30 largest) from
// `--profile-steps` more steps with every op timed. With `--device cpu --bf16-attention 1`
// the CPU's attention serves the bf16 policy through its bf16 entries, as cuDNN's does on a
// GPU, so the step keeps the tensors a GPU step with cuDNN keeps: its peak memory, measured
// without a GPU (slow: minutes a step at batch 8).
// The same losses from the same weights: one more line (gpu_gpt2_124m_losses) holds the
// training loss of each of the first `--loss-steps` steps from initialisation (warm-up
// included; read at the end of each step, as every step's loss is, so the timed steps
// carry no extra synchronisation; steps past the timed ones are run untimed where needed).
// `--weights-out` writes the initial parameters as safetensors (f32, DistJax's paths and
// layouts, see write_weights), `--tokens-out` the batches of those steps as a .npy of i32
// (N, 2, B, T): [s, 0] the inputs and [s, 1] the targets of step s (every step trains on
// the same batch today). bench/reference/torch_gpt2.py and jax_gpt2.py load both
// (WEIGHTS=, TOKENS=) and print their own losses for the same steps.
// bench/gpu.sh runs it with the references and writes bench/results/gpu-latest.jsonl.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/tensor/cpu/kernels.hpp"
#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "distjax/train/detail/safetensors.hpp"

namespace {

using namespace distjax;
using tensor::Tensor;
using tensor::TensorTree;
using Clock = std::chrono::steady_clock;

struct Options {
  std::int64_t batch = 16, steps = 20, warmup = 3, layers = 12, seq = 1024, profile_steps = 2;
  std::int64_t loss_steps = 20;         // the losses recorded from initialisation
  std::string weights_out, tokens_out;  // empty: not written
  std::string precision = "bf16";
  std::string device = "cuda";  // another device (cpu) runs a small smoke test of the program
  bool bf16_attention = false;  // the CPU's attention as cuDNN's (the GPU step's tensors)
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--batch")
      o.batch = std::stoll(v);
    else if (k == "--steps")
      o.steps = std::stoll(v);
    else if (k == "--warmup")
      o.warmup = std::stoll(v);
    else if (k == "--layers")
      o.layers = std::stoll(v);
    else if (k == "--seq")
      o.seq = std::stoll(v);
    else if (k == "--precision")
      o.precision = v;
    else if (k == "--device")
      o.device = v;
    else if (k == "--profile-steps")
      o.profile_steps = std::stoll(v);
    else if (k == "--bf16-attention")
      o.bf16_attention = v == "1";
    else if (k == "--loss-steps")
      o.loss_steps = std::stoll(v);
    else if (k == "--weights-out")
      o.weights_out = v;
    else if (k == "--tokens-out")
      o.tokens_out = v;
    else {
      std::fprintf(stderr, "bench_gpu_gpt2: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return o;
}

// Random ids in [0, v) on the host.
Tensor random_ids(const Shape& shape, std::uint64_t seed, std::int64_t v) {
  std::vector<float> u(static_cast<std::size_t>(numel(shape)));
  random_uniform(Key::from_seed(seed), u.data(), numel(shape), 0.f, 1.f);
  std::vector<std::int32_t> ids(u.size());
  for (std::size_t i = 0; i < u.size(); ++i)
    ids[i] = std::min<std::int32_t>(static_cast<std::int32_t>(u[i] * v),
                                    static_cast<std::int32_t>(v - 1));
  return Tensor::from_vector(ids, shape, Device::cpu());
}

// The initial parameters as one safetensors file: f32, DistJax's paths ("wte/embedding"
// (V, C), "wpe/embedding" (T, C), "blocks/<i>/{ln1,ln2}/{scale,bias}",
// "blocks/<i>/attn/{qkv,out}/{kernel,bias}", "blocks/<i>/mlp/{fc1,fc2}/{kernel,bias}",
// "ln_f/{scale,bias}"), kernels (in, out) for y = x @ kernel + bias, the QKV kernel's 3C
// columns ordered (H, 3, D): per head its q, k and v columns side by side. The head is
// tied to wte. The metadata says so for a reader.
void write_weights(const std::string& path, const TensorTree& params,
                   const models::TransformerConfig& cfg) {
  std::vector<std::pair<std::string, Tensor>> host;
  for (const auto& [name, t] : params)
    host.emplace_back(name, t.to(Device::cpu()));
  train::detail::write_safetensors(path, host,
                                   {{"format", "distjax.gpt2"},
                                    {"vocab", std::to_string(cfg.vocab)},
                                    {"d_model", std::to_string(cfg.d_model)},
                                    {"num_layers", std::to_string(cfg.num_layers)},
                                    {"num_heads", std::to_string(cfg.num_heads)},
                                    {"max_len", std::to_string(cfg.max_len)},
                                    {"ln_eps", std::to_string(cfg.ln_eps)},
                                    {"tied_embeddings", cfg.tied_embeddings ? "true" : "false"},
                                    {"kernel_layout", "(in, out): y = x @ kernel + bias"},
                                    {"qkv_columns", "(H, 3, D): per head q, k, v"}});
}

// The batches of `steps` steps as a .npy (format 1.0) of little-endian i32
// (steps, 2, B, T): [s, 0] the inputs, [s, 1] the targets of step s.
void write_tokens(const std::string& path, std::int64_t steps, const Tensor& inp,
                  const Tensor& tgt) {
  const std::vector<std::int32_t> x = inp.to(Device::cpu()).to_vector<std::int32_t>();
  const std::vector<std::int32_t> y = tgt.to(Device::cpu()).to_vector<std::int32_t>();
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (" +
                       std::to_string(steps) + ", 2, " + std::to_string(inp.size(0)) + ", " +
                       std::to_string(inp.size(1)) + "), }";
  // Magic (6) + version (2) + length (2) + header, padded with spaces to 64 bytes, '\n' last.
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  const std::uint16_t len = static_cast<std::uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);  // little-endian, as the x86/ARM hosts
  f << header;
  for (std::int64_t s = 0; s < steps; ++s) {
    f.write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * 4));
    f.write(reinterpret_cast<const char*>(y.data()), static_cast<std::streamsize>(y.size() * 4));
  }
  if (!f) {
    std::fprintf(stderr, "bench_gpu_gpt2: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

void emit(const nlohmann::json& j) {
  const std::string line = j.dump();
  std::printf("%s\n", line.c_str());
  if (const char* path = std::getenv("DISTJAX_BENCH_OUT"))
    std::ofstream(path, std::ios::app) << line << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const Device gpu = parse_device(o.device);
  if (gpu.kind == DeviceKind::CUDA && tensor::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_gpu_gpt2: no GPU: %s\n", tensor::cuda_unavailable_reason().c_str());
    return 1;
  }
  if (o.bf16_attention) {
    if (gpu.kind != DeviceKind::CPU) {
      std::fprintf(stderr, "bench_gpu_gpt2: --bf16-attention is for --device cpu\n");
      return 2;
    }
    tensor::detail::cpu::set_serves_bf16_attention(true);
  }
  DeviceScope on(gpu);
  models::TransformerConfig cfg;
  cfg.vocab = 50304;
  cfg.d_model = 768;
  cfg.num_layers = o.layers;
  cfg.num_heads = 12;
  cfg.mlp_ratio = 4;
  cfg.max_len = o.seq;
  cfg.learned_positions = true;
  cfg.tied_embeddings = true;
  cfg.dropout = 0.f;
  cfg.ln_eps = 1e-5f;
  const models::Transformer gpt(cfg);
  TensorTree params = gpt.init(Key::from_seed(0));
  const Tensor inp = random_ids({o.batch, o.seq}, 1, cfg.vocab).to(gpu);
  const Tensor tgt = random_ids({o.batch, o.seq}, 2, cfg.vocab).to(gpu);
  if (!o.weights_out.empty()) write_weights(o.weights_out, params, cfg);
  if (!o.tokens_out.empty()) write_tokens(o.tokens_out, o.loss_steps, inp, tgt);
  const nn::Precision precision = o.precision == "bf16" ? nn::Precision::bf16() : nn::Precision{};
  auto loss_fn = [&](const TensorTree& p, const Tensor& x, const Tensor& y) {
    const nn::Scope scope = nn::Scope::apply(&p, /*train=*/true).with_precision(precision);
    return gpt.loss(scope, x, y);
  };
  optim::AdamW opt({.learning_rate = optim::constant_schedule(3e-4),
                    .b1 = 0.9,
                    .b2 = 0.95,
                    .eps = 1e-8,
                    .weight_decay = 0.1,
                    .decay_mask = {}});
  TensorTree state = opt.init(params);
  std::int64_t step = 0;
  float loss = 0.f;
  std::vector<float> losses;  // of the first o.loss_steps steps
  // One step; the loss is read (a host synchronisation) at its end, so each step's time is
  // its whole device work.
  auto train_step = [&] {
    auto [l, grads] = autodiff::value_and_grad(loss_fn)(params, inp, tgt);
    opt.update(params, grads, state, step++);
    loss = l.item<float>();
    if (step <= o.loss_steps) losses.push_back(loss);
  };
  for (std::int64_t i = 0; i < o.warmup; ++i)
    train_step();
  tensor::reset_peak_bytes(gpu.kind);
  std::vector<double> times;
  for (std::int64_t i = 0; i < o.steps; ++i) {
    const auto t0 = Clock::now();
    train_step();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted[sorted.size() / 2];
  const double tokens = static_cast<double>(o.batch * o.seq);
  const double n_params = static_cast<double>(gpt.num_params());
  const double head = 768.0 / 12.0;
  const double flops_per_token =
      6 * n_params + 12.0 * static_cast<double>(o.layers) * 12 * head * static_cast<double>(o.seq);
  const double tok_s = tokens / med;
  const tensor::CudaMemoryStats mem = tensor::cuda_memory_stats(0);
  nlohmann::json j;
  j["name"] = "gpu_gpt2_124m_tokens_per_s";
  j["value"] = tok_s;
  j["unit"] = "tokens/s";
  j["framework"] = "distjax";
  j["device"] = gpu.str();
  j["precision"] = o.precision;
  j["batch"] = o.batch;
  j["seq"] = o.seq;
  j["layers"] = o.layers;
  j["params"] = gpt.num_params();
  j["step_ms_median"] = med * 1e3;
  j["step_ms_min"] = sorted.front() * 1e3;
  j["steps"] = o.steps;
  j["mfu"] = tok_s * flops_per_token / 989e12;
  j["peak_mem_gib"] = static_cast<double>(tensor::peak_bytes(gpu.kind)) / (1 << 30);
  j["reserved_peak_gib"] = static_cast<double>(mem.reserved_peak) / (1 << 30);
  j["loss_final"] = loss;
  // Whether linear's epilogues (GELU, bf16 outputs) ran in cuBLASLt's or fell back.
  const tensor::CudaGemmEpilogueCalls epi = tensor::cuda_gemm_epilogue_calls();
  j["gemm_epilogues"] = {{"fused", epi.fused}, {"unfused", epi.unfused}};
  // DISTJAX_CUDA_GEMM_TUNE=1: what timing the heuristic's candidates found.
  const tensor::CudaGemmTuning tuning = tensor::cuda_gemm_tuning();
  if (tuning.problems > 0)
    j["gemm_tuning"] = {{"problems", tuning.problems},
                        {"changed", tuning.changed},
                        {"saved_ms_per_call", tuning.saved_ms_per_call}};
  j["attention"] = gpu.kind == DeviceKind::CUDA ? tensor::cuda_attention_library()
                   : o.bf16_attention           ? std::string("the CPU's bf16 entries (as cuDNN's)")
                                                : std::string("the CPU's f32 kernels");
  emit(j);

  // The losses of the first o.loss_steps steps (the steps past the timed ones untimed).
  while (step < o.loss_steps)
    train_step();
  if (o.loss_steps > 0)
    emit({{"name", "gpu_gpt2_124m_losses"},
          {"losses", losses},
          {"framework", "distjax"},
          {"device", gpu.str()},
          {"precision", o.precision},
          {"batch", o.batch},
          {"seq", o.seq},
          {"layers", o.layers},
          {"attention", j["attention"]}});

  // Where a step's device time goes: two more steps with every op timed by CUDA events
  // (apart from the timed steps above: the events cost a little per op).
  if (gpu.kind == DeviceKind::CUDA && o.profile_steps > 0) {
    tensor::profile_ops_begin();
    for (std::int64_t i = 0; i < o.profile_steps; ++i)
      train_step();
    const std::vector<tensor::OpTime> ops = tensor::profile_ops_end();
    const double steps = static_cast<double>(o.profile_steps);
    for (std::size_t i = 0; i < ops.size() && i < 30; ++i)
      emit({{"name", "gpu_gpt2_124m_op_time"},
            {"op", ops[i].op},
            {"ms_per_step", ops[i].ms / steps},
            {"calls_per_step", static_cast<double>(ops[i].calls) / steps},
            {"share_of_step", ops[i].ms / steps / (med * 1e3)}});
  }
  return 0;
}
