// The Python front's costs (issue: DistJax from Python), each against the same work in C++
// measured in this run; the Python side is bench/reference/python_front.py, run by this
// program with the module of this build (<build>/python).
//
//   py_op_call_overhead_us   a small op (add of two 4-element tensors) called from Python,
//                            minus the same op called from C++ (microseconds per call)
//   py_shard_map_dp2_vs_cpp  a data-parallel MLP step (value_and_grad, pmean of the
//                            gradients, SGD) on 2 simulated devices under shard_map written
//                            in Python, against the same step in C++: C++ time / Python time
//   py_train_step_vs_cpp     the GPT of configs/train_gpt.toml (4 blocks, width 128, batch
//                            8 x 64 tokens) trained by a loop of value_and_grad and AdamW
//                            written in Python, against the same loop in C++: C++ time /
//                            Python time
//
// Usage: bench_python [--seconds S] [--rounds R] [--python P]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>

#include "bench_util.hpp"
#include "distjax/autodiff/autodiff.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/nn/initializers.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/nn_ops.hpp"
#include "distjax/tensor/reduce.hpp"

using namespace distjax;
using namespace distjax::bench;
using tensor::Tensor;
using tensor::TensorTree;

namespace {

struct Options {
  double seconds = 1.0;
  int rounds = 3;
  std::string python = "/usr/bin/python3";
  int batch = 256, width = 256, hidden = 512;
};

double per_call(const std::function<void()>& fn, double seconds, int inner) {
  return median(time_calls(fn, 3, inner, seconds, 5));
}

double cpp_add_s(const Options& o) {
  const Tensor a = Tensor::full({4}, 1.0), b = Tensor::full({4}, 2.0);
  Tensor sink;
  return per_call([&] { sink = tensor::add(a, b); }, o.seconds, 2000);
}

// The step of python_front.py, in C++: the same shapes, initialisers and update.
double cpp_dp2_step_s(const Options& o) {
  mesh::Mesh mesh({2}, {"data"});
  const Tensor w1 = nn::normal(0.05)(Key::from_seed(1), {o.width, o.hidden});
  const Tensor w2 = nn::normal(0.05)(Key::from_seed(2), {o.hidden, 10});
  const Tensor b1 = Tensor::zeros({o.hidden}), b2 = Tensor::zeros({10});
  const Tensor x = nn::normal(1.0)(Key::from_seed(3), {o.batch, o.width});
  std::vector<std::int32_t> labels(static_cast<std::size_t>(o.batch));
  for (int i = 0; i < o.batch; ++i) labels[static_cast<std::size_t>(i)] = i % 10;
  const Tensor y = Tensor::from_vector(labels, {o.batch});
  using mesh::P;
  auto step = spmd::shard_map(
      mesh,
      [](spmd::DeviceContext& ctx, const std::vector<Tensor>& in) {
        TensorTree p;
        p.set("b1", in[0]);
        p.set("b2", in[1]);
        p.set("w1", in[2]);
        p.set("w2", in[3]);
        auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& t) {
          Tensor h = tensor::relu(tensor::linear(in[4], t.at("w1"), t.at("b1")));
          return tensor::mean(tensor::cross_entropy(tensor::linear(h, t.at("w2"), t.at("b2")), in[5]));
        })(p);
        std::vector<Tensor> out{spmd::pmean(ctx, loss, "data")};
        for (const char* name : {"b1", "b2", "w1", "w2"})
          out.push_back(tensor::sub(p.at(name),
                                    tensor::mul_scalar(spmd::pmean(ctx, g.at(name), "data"), 0.1)));
        return out;
      },
      {P(), P(), P(), P(), P("data"), P("data")}, {P(), P(), P(), P(), P()});
  return per_call([&] { step({b1, b2, w1, w2, x, y}); }, o.seconds, 5);
}

// The GPT loop of python_front.py, in C++.
double cpp_gpt_step_s(const Options& o) {
  // Set field by field: g++ 12 takes the designated initializer's TPPlan::axis string for
  // uninitialised (-Wmaybe-uninitialized, a false positive).
  models::TransformerConfig config;
  config.vocab = 256;
  config.d_model = 128;
  config.num_layers = 4;
  config.num_heads = 4;
  config.max_len = 64;
  const models::Transformer gpt(config);
  TensorTree params = gpt.init(Key::from_seed(0));
  optim::AdamWConfig c;
  c.learning_rate = optim::constant_schedule(1e-3);
  c.weight_decay = 0.1;
  c.decay_mask = optim::default_decay_mask();
  const optim::AdamW adamw(c);
  TensorTree state = adamw.init(params);
  std::vector<std::int32_t> tokens(8 * 64), targets(8 * 64);
  for (std::int32_t i = 0; i < 8 * 64; ++i) {
    tokens[static_cast<std::size_t>(i)] = (i * 37) % 256;
    targets[static_cast<std::size_t>(i)] = (i * 37 + 37) % 256;
  }
  const Tensor x = Tensor::from_vector(tokens, {8, 64}), y = Tensor::from_vector(targets, {8, 64});
  std::int64_t step = 0;
  return per_call(
      [&] {
        auto [loss, grads] = autodiff::value_and_grad([&](const TensorTree& p) {
          return gpt.loss(nn::Scope::apply(&p, true, Key::from_seed(0)), x, y);
        })(params);
        adamw.update(params, grads, state, step++);
      },
      o.seconds, 3);
}

/// {"add_s", "dp2_step_s", "gpt_step_s"} of python_front.py, run now; `error` set when it could not run.
json python_side(const Options& o) {
  return reference_result("PYTHONPATH=" + std::string(DISTJAX_PYTHON_PACKAGE_DIR) + " " +
                              o.python + " " + DISTJAX_SOURCE_DIR +
                              "/bench/reference/python_front.py --seconds " +
                              std::to_string(o.seconds),
                          "add_s");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"DistJax's Python front against the same work in C++"};
  app.add_option("--seconds", o.seconds, "timed seconds per measurement and round");
  app.add_option("--rounds", o.rounds, "rounds alternating the Python side and the C++ side");
  app.add_option("--python", o.python, "the interpreter that loads <build>/python");
  CLI11_PARSE(app, argc, argv);
  Writer out;
  // Rounds alternating the Python process and this one, so that both see the machine in the
  // same states (2 shared cores); the medians over the rounds are compared.
  json py = json::object();
  std::map<std::string, std::vector<double>> times;
  for (int r = 0; r < o.rounds && !py.contains("error"); ++r) {
    const json round = python_side(o);
    if (round.contains("error")) {
      py = round;
      break;
    }
    for (const char* k : {"add_s", "dp2_step_s", "gpt_step_s"}) times[k].push_back(round[k]);
    times["gpt_cpp"].push_back(cpp_gpt_step_s(o));
    times["add_cpp"].push_back(cpp_add_s(o));
    times["dp2_cpp"].push_back(cpp_dp2_step_s(o));
  }
  const bool ok = !py.contains("error");
  if (ok)
    for (const char* k : {"add_s", "dp2_step_s", "gpt_step_s"}) py[k] = median(times[k]);
  const double gpt_cpp = median(times["gpt_cpp"]), add_cpp = median(times["add_cpp"]),
               step_cpp = median(times["dp2_cpp"]);

  // One line: `value` from the Python side's seconds `py_s` (null, with the reason, when the
  // Python side could not run), with the C++ baseline and the target.
  auto report = [&](const std::string& name, const char* key, double cpp_s, double target,
                    bool higher, const std::string& baseline,
                    const std::function<double(double)>& value) {
    json l = line(name, 0, higher ? "ratio" : "us");
    l["better"] = higher ? "higher" : "lower";
    l["target"] = target;
    l["baseline"] = baseline + ", this run";
    l["baseline_value"] = cpp_s;
    if (ok) {
      const double v = value(py[key].get<double>());
      l["value"] = v;
      l["python_s"] = py[key];
      l["meets_target"] = higher ? v >= target : v <= target;
    } else {
      l["value"] = nullptr;
      l["reason"] = py["error"];
    }
    out.write(l);
  };
  report("py_op_call_overhead_us", "add_s", add_cpp, 2.0, false,
         "the same add of two 4-element f32 tensors called from C++ (seconds per call)",
         [&](double py_s) { return (py_s - add_cpp) * 1e6; });
  report("py_shard_map_dp2_vs_cpp", "dp2_step_s", step_cpp, 0.8, true,
         "the same shard_map step in C++ (2 simulated devices, MLP " + std::to_string(o.width) +
             "-" + std::to_string(o.hidden) + "-10, batch " + std::to_string(o.batch) + ")",
         [&](double py_s) { return step_cpp / py_s; });
  report("py_train_step_vs_cpp", "gpt_step_s", gpt_cpp, 0.95, true,
         "the same GPT loop in C++ (value_and_grad, AdamW; 4 blocks, width 128, batch 8 x 64)",
         [&](double py_s) { return gpt_cpp / py_s; });
  return 0;
}
