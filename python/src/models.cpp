// The GPT (models::Transformer) and the optimizers from Python, over parameter trees as
// nested dicts of tensors (a TensorTree's path "blocks/0/attn/qkv/kernel" is
// params["blocks"]["0"]["attn"]["qkv"]["kernel"]): what a Python training loop over
// value_and_grad needs.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"

#include "distjax/core/error.hpp"
#include "distjax/models/transformer.hpp"
#include "distjax/nn/dense.hpp"
#include "distjax/nn/embedding.hpp"
#include "distjax/nn/layer_norm.hpp"
#include "distjax/nn/rms_norm.hpp"
#include "distjax/nn/scope.hpp"
#include "distjax/optim/adam.hpp"
#include "distjax/optim/adamw.hpp"
#include "distjax/optim/schedule.hpp"
#include "distjax/optim/sgd.hpp"

namespace distjax::python {

namespace {

using tensor::TensorTree;
using Released = nb::call_guard<nb::gil_scoped_release>;

void add_leaves(nb::handle node, const std::string& prefix, TensorTree& out) {
  if (nb::isinstance<nb::dict>(node)) {
    for (auto [k, v] : nb::cast<nb::dict>(node)) {
      const std::string key = nb::cast<std::string>(nb::str(k));
      add_leaves(v, prefix.empty() ? key : prefix + "/" + key, out);
    }
    return;
  }
  out.set(prefix, tensor_from_object(node, false));
}

nb::dict to_dict(const TensorTree& tree) {
  nb::dict root;
  for (const auto& [path, t] : tree) {
    nb::dict node = root;
    std::size_t at = 0;
    for (std::size_t slash; (slash = path.find('/', at)) != std::string::npos; at = slash + 1) {
      nb::str key(path.substr(at, slash - at).c_str());
      if (!node.contains(key)) node[key] = nb::dict();
      node = nb::cast<nb::dict>(node[key]);
    }
    node[nb::str(path.substr(at).c_str())] = nb::cast(t);
  }
  return root;
}

optim::Schedule schedule_of(nb::handle lr) {
  if (nb::isinstance<nb::float_>(lr) || nb::isinstance<nb::int_>(lr))
    return optim::constant_schedule(nb::cast<double>(lr));
  // A Python function of the step: called with the interpreter lock, from the updating thread.
  auto fn = std::shared_ptr<nb::callable>(new nb::callable(nb::cast<nb::callable>(lr)),
                                          [](nb::callable* p) {
                                            nb::gil_scoped_acquire gil;
                                            delete p;
                                          });
  return [fn](std::int64_t step) {
    nb::gil_scoped_acquire gil;
    return nb::cast<double>((*fn)(step));
  };
}

/// Binds a layer of nn: `init(seed, x)` -> its parameters as a dict (the shapes follow x),
/// `apply(params, x)` -> its output (differentiable in both).
template <class Layer>
void bind_layer(nb::class_<Layer>& cls) {
  auto apply = [](const Layer& layer, nb::handle params, nb::handle x) {
    const TensorTree p = tree_of_dict(params);
    const Tensor input = tensor_from_object(x, false);
    nb::gil_scoped_release nogil;
    return layer(nn::Scope::apply(&p, false), input);
  };
  cls.def("init",
          [](const Layer& layer, std::uint64_t seed, nb::handle x) {
            const Tensor input = tensor_from_object(x, false);
            TensorTree p;
            {
              nb::gil_scoped_release nogil;
              layer(nn::Scope::init(&p, Key::from_seed(seed)), input);
            }
            return to_dict(p);
          },
          nb::arg("seed"), nb::arg("x"), "Fresh parameters for an input like x")
      .def("apply", apply, nb::arg("params"), nb::arg("x"))
      .def("__call__", apply, nb::arg("params"), nb::arg("x"));
}

}  // namespace

tensor::TensorTree tree_of_dict(nb::handle params) {
  DISTJAX_CHECK(nb::isinstance<nb::dict>(params), InvalidArgument,
                "[distjax] parameters must be a dict of dicts of tensors, got ",
                nb::cast<std::string>(nb::str(params.type())));
  TensorTree tree;
  add_leaves(params, "", tree);
  return tree;
}

void bind_models(nb::module_& m) {
  using nb::arg;
  using models::Transformer;
  using models::TransformerConfig;
  nb::module_ models = m.def_submodule("models", "Models over parameter dicts");
  nb::class_<Transformer>(models, "Transformer", "The GPT of configs/train_gpt.toml")
      .def("__init__",
           [](Transformer* self, std::int64_t vocab, std::int64_t d_model, std::int64_t num_layers,
              std::int64_t num_heads, std::int64_t max_len, std::int64_t mlp_ratio,
              bool tied_embeddings, float dropout, bool remat) {
             TransformerConfig c;
             c.vocab = vocab;
             c.d_model = d_model;
             c.num_layers = num_layers;
             c.num_heads = num_heads;
             c.max_len = max_len;
             c.mlp_ratio = mlp_ratio;
             c.tied_embeddings = tied_embeddings;
             c.dropout = dropout;
             c.remat = remat;
             new (self) Transformer(c);
           },
           arg("vocab") = 256, arg("d_model") = 128, arg("num_layers") = 4, arg("num_heads") = 4,
           arg("max_len") = 128, arg("mlp_ratio") = 4, arg("tied_embeddings") = true,
           arg("dropout") = 0.f, arg("remat") = false)
      .def("init",
           [](const Transformer& t, std::uint64_t seed) {
             TensorTree p;
             {
               nb::gil_scoped_release nogil;
               p = t.init(Key::from_seed(seed));
             }
             return to_dict(p);
           },
           arg("seed") = 0, "Fresh parameters as a dict tree (the same seed, the same values)")
      .def("loss",
           [](const Transformer& t, nb::handle params, nb::handle tokens, nb::handle targets,
              bool train, std::uint64_t seed) {
             const TensorTree p = tree_of_dict(params);
             const Tensor x = tensor_from_object(tokens, false), y = tensor_from_object(targets, false);
             nb::gil_scoped_release nogil;
             return t.loss(nn::Scope::apply(&p, train, Key::from_seed(seed)), x, y);
           },
           arg("params"), arg("tokens"), arg("targets"), arg("train") = true, arg("seed") = 0,
           "Mean next-token cross-entropy of tokens (B, T) against targets (B, T)")
      .def("apply",
           [](const Transformer& t, nb::handle params, nb::handle tokens) {
             const TensorTree p = tree_of_dict(params);
             const Tensor x = tensor_from_object(tokens, false);
             nb::gil_scoped_release nogil;
             return t.apply(p, x, false, Key{});
           },
           arg("params"), arg("tokens"), "Logits (B, T, vocab)");

  nb::module_ layers = m.def_submodule("layers", "The layers of nn over parameter dicts");
  nb::class_<nn::Dense> dense(layers, "Dense", "y = x @ kernel + bias over the last dimension");
  dense.def("__init__",
            [](nn::Dense* self, std::int64_t features, bool use_bias) {
              new (self) nn::Dense{.features = features, .use_bias = use_bias};
            },
            arg("features"), arg("use_bias") = true);
  bind_layer(dense);
  nb::class_<nn::LayerNorm> layer_norm(layers, "LayerNorm");
  layer_norm.def("__init__",
                 [](nn::LayerNorm* self, float eps, bool use_bias) {
                   new (self) nn::LayerNorm{.eps = eps, .use_bias = use_bias};
                 },
                 arg("eps") = 1e-5f, arg("use_bias") = true);
  bind_layer(layer_norm);
  nb::class_<nn::RMSNorm> rms_norm(layers, "RMSNorm");
  rms_norm.def("__init__", [](nn::RMSNorm* self, float eps) { new (self) nn::RMSNorm{.eps = eps}; },
               arg("eps") = 1e-6f);
  bind_layer(rms_norm);
  nb::class_<nn::Embedding> embedding(layers, "Embedding", "Rows of a (num, features) table");
  embedding.def("__init__",
                [](nn::Embedding* self, std::int64_t num, std::int64_t features) {
                  new (self) nn::Embedding{.num_embeddings = num, .features = features};
                },
                arg("num_embeddings"), arg("features"));
  bind_layer(embedding);

  nb::module_ optim = m.def_submodule("optim", "Optimizers over parameter dicts");
  nb::class_<optim::Optimizer>(optim, "Optimizer")
      .def("init",
           [](const optim::Optimizer& o, nb::handle params) {
             const TensorTree p = tree_of_dict(params);
             TensorTree s;
             {
               nb::gil_scoped_release nogil;
               s = o.init(p);
             }
             return to_dict(s);
           },
           arg("params"), "The optimizer state of `params` (zeros)")
      .def("update",
           [](const optim::Optimizer& o, nb::handle params, nb::handle grads, nb::handle state,
              std::int64_t step) {
             TensorTree p = tree_of_dict(params), g = tree_of_dict(grads);
             TensorTree s = nb::cast<nb::dict>(state).size() ? tree_of_dict(state) : TensorTree();
             {
               nb::gil_scoped_release nogil;
               o.update(p, g, s, step);
             }
             return nb::make_tuple(to_dict(p), to_dict(s));
           },
           arg("params"), arg("grads"), arg("state"), arg("step"),
           "One step: (new params, new state); the tensors are updated in place, as in C++")
      .def("learning_rate", &optim::Optimizer::learning_rate, arg("step"))
      .def_prop_ro("name", &optim::Optimizer::name);
  nb::class_<optim::AdamW, optim::Optimizer>(optim, "AdamW")
      .def("__init__",
           [](optim::AdamW* self, nb::handle lr, double b1, double b2, double eps, double wd,
              bool decay_all) {
             optim::AdamWConfig c;
             c.learning_rate = schedule_of(lr);
             c.b1 = b1;
             c.b2 = b2;
             c.eps = eps;
             c.weight_decay = wd;
             if (!decay_all) c.decay_mask = optim::default_decay_mask();
             new (self) optim::AdamW(c);
           },
           arg("lr") = 1e-3, arg("b1") = 0.9, arg("b2") = 0.999, arg("eps") = 1e-8,
           arg("weight_decay") = 1e-2, arg("decay_all") = false,
           "AdamW; lr a number or a function of the step; no decay on biases and norms "
           "unless decay_all");
  nb::class_<optim::Adam, optim::Optimizer>(optim, "Adam")
      .def("__init__",
           [](optim::Adam* self, nb::handle lr, double b1, double b2, double eps) {
             optim::AdamConfig c;
             c.learning_rate = schedule_of(lr);
             c.b1 = b1;
             c.b2 = b2;
             c.eps = eps;
             new (self) optim::Adam(c);
           },
           arg("lr") = 1e-3, arg("b1") = 0.9, arg("b2") = 0.999, arg("eps") = 1e-8);
  nb::class_<optim::SGD, optim::Optimizer>(optim, "SGD")
      .def("__init__",
           [](optim::SGD* self, nb::handle lr, double momentum, bool nesterov, double wd) {
             optim::SGDConfig c;
             c.learning_rate = schedule_of(lr);
             c.momentum = momentum;
             c.nesterov = nesterov;
             c.weight_decay = wd;
             new (self) optim::SGD(c);
           },
           arg("lr") = 1e-2, arg("momentum") = 0.0, arg("nesterov") = false,
           arg("weight_decay") = 0.0);
  optim.def("warmup_cosine_schedule",
            [](double init, double peak, std::int64_t warmup, std::int64_t decay, double end) {
              return nb::cpp_function([s = optim::warmup_cosine_schedule(init, peak, warmup, decay,
                                                                          end)](std::int64_t step) {
                return s(step);
              });
            },
            arg("init_value"), arg("peak_value"), arg("warmup_steps"), arg("decay_steps"),
            arg("end_value") = 0.0, "A learning-rate schedule, as a function of the step");
}

}  // namespace distjax::python
