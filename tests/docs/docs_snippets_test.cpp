// The code snippets of docs/*.md, compiled and run with real assertions, so the
// documentation cannot drift from the headers. Each test names the page and section
// its snippet comes from; when you change a snippet in the docs, change it here too.
// This file: README.md, tensor-and-autodiff.md, spmd.md, training.md; the parallelism
// and training-system pages are in docs_parallel_snippets_test.cpp.
#include "docs/snippet_util.hpp"

using namespace distjax;
using distjax::testing::contains;
using distjax::testing::error_of;
using mesh::P;
// ------------------------------------------------------------ README.md

TEST(DocsReadme, UsingTheLibrary) {
  TensorTree params;
  params.set("w", Tensor::from_vector<float>({0.5f, -1.f, 2.f}, {3}));
  Tensor x = Tensor::from_vector<float>({1.f, 2.f, 3.f}, {3});
  auto [loss, grads] = autodiff::value_and_grad(
      [&](const TensorTree& p) { return tensor::sum(tensor::mul(p.at("w"), x)); })(params);
  // grads.at("w") == x
  EXPECT_FLOAT_EQ(loss.item<float>(), 0.5f - 2.f + 6.f);
  EXPECT_EQ(grads.at("w").to_vector<float>(), x.to_vector<float>());
}

// ------------------------------------------------------------ tensor-and-autodiff.md

// "Tensor"
TEST(DocsTensor, TensorBasics) {
  using namespace distjax::tensor;
  Tensor x = Tensor::from_vector<float>({1.f, 2.f, 3.f, 4.f}, {2, 2});
  Tensor y = matmul(x, x);  // (2, 2): [[7, 10], [15, 22]]
  float v = sum(y).item<float>();
  EXPECT_EQ(v, 54.f);

  Tensor z = Tensor::zeros({2, 3});   // f32 by default
  Tensor ids = Tensor::arange(4);     // i64 [0, 1, 2, 3]
  Tensor h = astype(x, DType::BF16);  // storage type, computed in f32
  EXPECT_EQ(z.dtype(), DType::F32);
  EXPECT_EQ(ids.dtype(), DType::I64);
  EXPECT_EQ(h.dtype(), DType::BF16);
  EXPECT_EQ(std::string(dtype_name(h.dtype())), "bf16");

  Tensor c = x.clone();             // deep copy
  Tensor rows = x.view_rows(1, 2);  // shares storage, (1, 2)
  EXPECT_TRUE(rows.shares_storage_with(x));
  EXPECT_FALSE(c.shares_storage_with(x));
  EXPECT_EQ(rows.to_vector<float>(), (std::vector<float>{3.f, 4.f}));
  EXPECT_THROW(x.data<std::int32_t>(), InvalidArgument);  // dtype is f32
}

// "The op set": shapes of the listed ops.
TEST(DocsTensor, OpShapes) {
  using namespace distjax::tensor;
  Tensor a = Tensor::ones({2, 3, 4});
  EXPECT_EQ(add(a, Tensor::ones({4})).shape(), (Shape{2, 3, 4}));  // broadcasting
  EXPECT_EQ((a * 2.0 + 1.0).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(reshape(a, {6, -1}).shape(), (Shape{6, 4}));
  EXPECT_EQ(transpose(a).shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(permute(a, {2, 0, 1}).shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(slice(a, 2, 1, 3).shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(concat({a, a}, 1).shape(), (Shape{2, 6, 4}));
  EXPECT_EQ(split(a, 2, -1)[1].shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(split(a, std::vector<std::int64_t>{1, 3}, 2)[1].shape(), (Shape{2, 3, 3}));
  EXPECT_EQ(stack({a, a}, 0).shape(), (Shape{2, 2, 3, 4}));
  EXPECT_EQ(broadcast_to(Tensor::ones({3, 1}), {2, 3, 4}).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(sum(a).shape(), (Shape{}));
  EXPECT_EQ(sum(a, {0, 2}).shape(), (Shape{3}));
  EXPECT_EQ(mean(a, {-1}, /*keepdims=*/true).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(max(a, {1}).shape(), (Shape{2, 4}));
  EXPECT_EQ(argmax(a, -1).dtype(), DType::I64);
  EXPECT_EQ(sum_to(a, {3, 1}).shape(), (Shape{3, 1}));
  EXPECT_EQ(sum_to(a, {3, 1}).to_vector<float>(), (std::vector<float>{8.f, 8.f, 8.f}));

  // Matrix products.
  Tensor x = Tensor::ones({5, 3});
  EXPECT_EQ(matmul(x, Tensor::ones({3, 7})).shape(), (Shape{5, 7}));
  EXPECT_EQ(matmul(x, Tensor::ones({7, 3}), false, /*trans_b=*/true).shape(), (Shape{5, 7}));
  EXPECT_EQ(matmul(Tensor::ones({4, 5, 3}), Tensor::ones({3, 2})).shape(), (Shape{4, 5, 2}));
  EXPECT_EQ(linear(x, Tensor::ones({3, 7}), Tensor::zeros({7})).shape(), (Shape{5, 7}));

  // Neural-network ops.
  Tensor logits = Tensor::zeros({4, 10});
  Tensor labels = Tensor::from_vector<std::int32_t>({0, 1, 2, 3}, {4});
  Tensor ce = cross_entropy(logits, labels);  // (4), each log(10)
  EXPECT_EQ(ce.shape(), (Shape{4}));
  EXPECT_NEAR(ce.to_vector<float>()[0], std::log(10.f), 1e-5);
  EXPECT_EQ(softmax(logits).shape(), (Shape{4, 10}));
  EXPECT_EQ(layer_norm(logits, Tensor::ones({10}), Tensor()).shape(), (Shape{4, 10}));
  EXPECT_EQ(rms_norm(logits, Tensor::ones({10})).shape(), (Shape{4, 10}));
  EXPECT_EQ(embedding(Tensor::ones({256, 8}), Tensor::arange(5)).shape(), (Shape{5, 8}));
  EXPECT_EQ(dropout(x, 0.5f, Key::from_seed(0)).shape(), (Shape{5, 3}));
  Tensor q = Tensor::ones({2, 4, 16, 8});  // (B, H, T, D)
  EXPECT_EQ(attention(q, q, q, /*causal=*/true).shape(), (Shape{2, 4, 16, 8}));
  EXPECT_EQ(where(Tensor::ones({3}), Tensor::ones({3}), Tensor::zeros({3})).to_vector<float>(),
            (std::vector<float>{1.f, 1.f, 1.f}));

  // Shape mismatches name the op.
  const std::string msg = error_of<InvalidArgument>([&] {
    add(Tensor::ones({2, 3}), Tensor::ones({4}));
  });
  EXPECT_TRUE(contains(msg, "[add]")) << msg;
}

// "value_and_grad and grad"
TEST(DocsTensor, ValueAndGradWithAux) {
  using namespace distjax::tensor;
  TensorTree params;
  params.set("w", Tensor::from_vector<float>({1.f, 2.f}, {2}));
  params.set("unused", Tensor::ones({3}));
  Tensor x = Tensor::from_vector<float>({3.f, 4.f}, {2});

  auto loss_fn = [&](const TensorTree& p, float scale) {
    Tensor y = mul(p.at("w"), x);
    Tensor loss = mul_scalar(sum(square(y)), scale);
    return std::make_pair(loss, y.detach());  // (loss, aux)
  };
  auto [out, grads] = autodiff::value_and_grad(loss_fn)(params, 0.5f);
  auto [loss, y] = out;
  EXPECT_FLOAT_EQ(loss.item<float>(), 0.5f * (9.f + 64.f));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{3.f, 8.f}));
  // d/dw 0.5 * sum((w x)^2) = w x^2
  EXPECT_EQ(grads.at("w").to_vector<float>(), (std::vector<float>{9.f, 32.f}));
  EXPECT_EQ(grads.at("unused").to_vector<float>(), (std::vector<float>{0.f, 0.f, 0.f}));

  TensorTree g = autodiff::grad([&](const TensorTree& p) { return sum(exp(p.at("w"))); })(params);
  EXPECT_NEAR(g.at("w").to_vector<float>()[1], std::exp(2.f), 1e-5);
}

// "Gradients of tensors"
TEST(DocsTensor, GradOfTensors) {
  using namespace distjax::tensor;
  Tensor a = make_leaf(Tensor::from_vector<float>({1.f, 2.f}, {2}));
  Tensor b = make_leaf(Tensor::from_vector<float>({3.f, 4.f}, {2}));
  Tensor out = sum(mul(a, b));
  std::vector<Tensor> g = autodiff::grad({out}, {Tensor()}, {a, b});
  EXPECT_EQ(g[0].to_vector<float>(), (std::vector<float>{3.f, 4.f}));  // = b
  EXPECT_EQ(g[1].to_vector<float>(), (std::vector<float>{1.f, 2.f}));  // = a

  NoGradGuard no_grad;  // nothing below is recorded
  Tensor c = mul(a, b);
  EXPECT_FALSE(c.requires_grad());
}

// "custom_vjp"
TEST(DocsTensor, CustomVjp) {
  using namespace distjax::tensor;
  // Straight-through rounding: forward rounds, backward passes the cotangent through.
  auto round_st = [](const Tensor& x) {
    return autodiff::custom_vjp1(
        "round_st", {x},
        [](const std::vector<Tensor>& in) {
          Tensor y = in[0].clone();
          for (float* p = y.data<float>(); p != y.data<float>() + y.numel(); ++p)
            *p = std::round(*p);
          return std::vector<Tensor>{y};
        },
        [](const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
           const std::vector<Tensor>& grad_outputs) {
          return std::vector<Tensor>{grad_outputs[0]};
        });
  };
  TensorTree p;
  p.set("x", Tensor::from_vector<float>({0.4f, 1.6f}, {2}));
  auto [loss, g] = autodiff::value_and_grad(
      [&](const TensorTree& q) { return sum(mul_scalar(round_st(q.at("x")), 3.0)); })(p);
  EXPECT_FLOAT_EQ(loss.item<float>(), 6.f);  // 3 * (0 + 2)
  EXPECT_EQ(g.at("x").to_vector<float>(), (std::vector<float>{3.f, 3.f}));
}

// "checkpoint"
TEST(DocsTensor, Checkpoint) {
  using namespace distjax::tensor;
  TensorTree p;
  p.set("w", Tensor::from_vector<float>({0.1f, 0.2f, -0.3f, 0.4f}, {2, 2}));
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  autodiff::RematFn block = [](const TensorTree& q, const std::vector<Tensor>& in) {
    return std::vector<Tensor>{tanh(matmul(in[0], q.at("w")))};
  };
  auto plain = [&](const TensorTree& q) { return sum(square(block(q, {x})[0])); };
  auto remat = [&](const TensorTree& q) {
    return sum(square(autodiff::checkpoint(block, q, {x})[0]));
  };
  auto g1 = autodiff::grad(plain)(p);
  auto g2 = autodiff::grad(remat)(p);  // same gradient, activations recomputed
  auto a = g1.at("w").to_vector<float>(), b = g2.at("w").to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_FLOAT_EQ(a[i], b[i]);
}

// "TensorTree"
TEST(DocsTensor, TensorTree) {
  using namespace distjax::tensor;
  TensorTree p;
  p.set("fc2/kernel", Tensor::zeros({512, 10}));
  p.set("fc1/kernel", Tensor::zeros({784, 512}));
  p.set("fc1/bias", Tensor::zeros({512}));
  EXPECT_EQ(p.paths(), (std::vector<std::string>{"fc1/bias", "fc1/kernel", "fc2/kernel"}));
  TensorTree fc1 = p.subtree("fc1");  // {"bias", "kernel"}
  EXPECT_EQ(fc1.paths(), (std::vector<std::string>{"bias", "kernel"}));
  TensorTree model;
  model.merge("encoder", fc1);  // "encoder/bias", "encoder/kernel"
  EXPECT_TRUE(model.contains("encoder/kernel"));
  TensorTree halved = p.map([](const Tensor& t) { return mul_scalar(t, 0.5); });
  TensorTree sums = p.zip(halved, [](const Tensor& a, const Tensor& b) { return add(a, b); });
  EXPECT_TRUE(sums.same_structure(p));
  EXPECT_EQ(p.num_elements(), 784 * 512 + 512 + 512 * 10);
  EXPECT_EQ(zeros_like(p).num_bytes(), 4 * p.num_elements());
  const std::string msg = error_of<InvalidArgument>([&] { p.at("fc1/kernle"); });
  EXPECT_TRUE(contains(msg, "fc1/kernle")) << msg;
}

// "Keys"
TEST(DocsTensor, Keys) {
  Key k = Key::from_seed(0);
  auto [k1, k2] = k.split2();
  Key per_layer = k.fold_in(3);
  Key per_param = k.fold_in(std::string_view("fc1/kernel"));
  EXPECT_NE(k1, k2);
  EXPECT_NE(per_layer, per_param);
  EXPECT_EQ(Key::from_seed(0).fold_in(3), per_layer);  // keys are values
  std::vector<float> u(4);
  random_uniform(k1, u.data(), 4);
  for (float v : u)
    EXPECT_TRUE(v >= 0.f && v < 1.f);
}

// ------------------------------------------------------------ spmd.md

// "Mesh"
TEST(DocsSpmd, Mesh) {
  mesh::Mesh mesh({2, 4}, {"data", "model"});  // 8 devices
  EXPECT_EQ(mesh.size(), 8);
  EXPECT_EQ(mesh.axis_size("model"), 4);
  EXPECT_EQ(mesh.coords(6), (std::vector<int>{1, 2}));
  EXPECT_EQ(mesh.device_at({1, 2}), 6);
  EXPECT_EQ(mesh.index_along(6, "data"), 1);
  EXPECT_EQ(mesh.group(6, "data"), (std::vector<int>{2, 6}));
  EXPECT_EQ(mesh.group(6, "model"), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(mesh.describe(), "(\"data\"=2, \"model\"=4)");
  EXPECT_THROW(mesh.axis_size("pipe"), ShardingError);
  EXPECT_FALSE(mesh.to_string().empty());
}

// "PartitionSpec and NamedSharding"
TEST(DocsSpmd, PartitionSpecAndNamedSharding) {
  mesh::Mesh mesh({2, 4}, {"data", "model"});
  EXPECT_EQ(P().size(), 0);
  EXPECT_EQ(P("data", "model").size(), 2);    // two entries
  EXPECT_EQ(P({"data", "model"}).size(), 1);  // one entry over data x model
  EXPECT_EQ(P("data", std::nullopt, "model").to_string(), "P(\"data\", None, \"model\")");

  mesh::NamedSharding s(mesh, P("data", std::nullopt));
  EXPECT_EQ(s.shard_shape({8, 4}), (Shape{4, 4}));
  EXPECT_EQ(s.replicated_axes(), (std::vector<std::string>{"model"}));
  mesh::NamedSharding both(mesh, P({"data", "model"}));
  EXPECT_EQ(both.shard_shape({16, 3}), (Shape{2, 3}));
}

// "ShardedArray, device_put and gather"
TEST(DocsSpmd, DevicePutAndGather) {
  mesh::Mesh mesh({2, 4}, {"data", "model"});
  std::vector<float> v(8 * 16);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(i);
  Tensor host = Tensor::from_vector(v, {8, 16});

  mesh::ShardedArray x = mesh::device_put(host, mesh::NamedSharding(mesh, P("data", "model")));
  EXPECT_EQ(x.shard(5).shape(), (Shape{4, 4}));  // rows 4..8, columns 4..8
  EXPECT_EQ(x.shard(5).to_vector<float>()[0], 4 * 16 + 4);
  Tensor back = mesh::gather(x);
  EXPECT_EQ(back.to_vector<float>(), v);

  // A spec that does not fit the shape: ShardingError naming argument, shape, spec, mesh.
  mesh::Mesh m42({4, 2}, {"data", "model"});
  const std::string msg = error_of<ShardingError>([&] {
    mesh::device_put(Tensor::zeros({6, 4}), mesh::NamedSharding(m42, P("data", "model")), "x");
  });
  EXPECT_TRUE(contains(msg,
                       "[device_put] argument \"x\" with shape (6, 4): spec P(\"data\", "
                       "\"model\") is invalid on mesh (\"data\"=4, \"model\"=2): dimension 0 "
                       "(6) is not divisible by \"data\"=4"))
      << msg;
}

// "shard_map"
TEST(DocsSpmd, ShardMapPsum) {
  using namespace distjax::spmd;
  Mesh mesh({2, 4}, {"data", "model"});
  Tensor x = Tensor::ones({4, 8});
  auto f = shard_map(mesh,
                     [](DeviceContext& ctx, const std::vector<Tensor>& in) {
                       // in[0] is this device's (2, 2) block
                       return std::vector<Tensor>{psum(ctx, tensor::sum(in[0]), {"data", "model"})};
                     },
                     {P("data", "model")}, {P()});
  std::vector<ShardedArray> out = f(std::vector<Tensor>{x});
  EXPECT_EQ(out[0].shape(), (Shape{}));
  EXPECT_EQ(mesh::gather(out[0]).item<float>(), 32.f);
}

// "shard_map": a data-parallel gradient step inside shard_map.
TEST(DocsSpmd, DataParallelGradient) {
  using namespace distjax::spmd;
  Mesh mesh = Mesh::line(4);  // axis "data"
  std::vector<float> xs(8 * 3);
  for (std::size_t i = 0; i < xs.size(); ++i)
    xs[i] = 0.1f * static_cast<float>(i);
  Tensor x = Tensor::from_vector(xs, {8, 3});
  Tensor w = Tensor::from_vector<float>({1.f, -1.f, 0.5f}, {3, 1});

  auto step = shard_map(
      mesh,
      [](DeviceContext& ctx, const std::vector<Tensor>& in) {
        TensorTree p;
        p.set("w", in[1]);  // replicated weights
        auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& q) {
          Tensor local = tensor::mean(tensor::square(tensor::matmul(in[0], q.at("w"))));
          return pmean(ctx, local, "data");  // the full-batch loss
        })(p);
        return std::vector<Tensor>{loss, g.at("w")};  // both replicated
      },
      {P("data"), P()}, {P(), P()}, {.check_replicated = true});
  auto out = step(std::vector<Tensor>{x, w});

  // The same on one device.
  TensorTree p;
  p.set("w", w);
  auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& q) {
    return tensor::mean(tensor::square(tensor::matmul(x, q.at("w"))));
  })(p);
  EXPECT_NEAR(mesh::gather(out[0]).item<float>(), loss.item<float>(), 1e-5);
  auto gd = mesh::gather(out[1]).to_vector<float>(), g1 = g.at("w").to_vector<float>();
  for (std::size_t i = 0; i < g1.size(); ++i)
    EXPECT_NEAR(gd[i], g1[i], 1e-5);
}

// "Collectives": shapes and transposes.
TEST(DocsSpmd, CollectivesAndTransposes) {
  using namespace distjax::spmd;
  Mesh mesh({2, 4}, {"data", "model"});
  std::mutex mu;
  int checked = 0;
  auto f = shard_map(
      mesh,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        const float d = static_cast<float>(ctx.device());
        Tensor x = pvary(ctx, Tensor::full({2, 3}, d), {"data", "model"});
        // Shapes, n = 4 along "model".
        EXPECT_EQ(all_gather(ctx, x, "model", 0, /*tiled=*/true).shape(), (Shape{8, 3}));
        EXPECT_EQ(all_gather(ctx, x, "model", 0, /*tiled=*/false).shape(), (Shape{4, 2, 3}));
        EXPECT_EQ(psum_scatter(ctx, Tensor::ones({8, 3}), "model", 0, true).shape(), (Shape{2, 3}));
        EXPECT_EQ(psum_scatter(ctx, Tensor::ones({4, 3}), "model", 0, false).shape(), (Shape{3}));
        EXPECT_EQ(all_to_all(ctx, Tensor::ones({8, 3}), "model", 0, 1).shape(), (Shape{2, 12}));
        // ppermute ring: device i along "model" receives from i - 1.
        Tensor r = ppermute(ctx, Tensor::scalar(axis_index(ctx, "model")), "model",
                            ring_permutation(4, 1));
        EXPECT_EQ(r.item<float>(), static_cast<float>((axis_index(ctx, "model") + 3) % 4));
        EXPECT_EQ(pmax(ctx, Tensor::scalar(d), {"data", "model"}).item<float>(), 7.f);

        // Transposes: grad of sum(all_gather(x)) is psum_scatter(ones) = n per element.
        TensorTree p;
        p.set("x", x);
        auto g = autodiff::grad([&](const TensorTree& t) {
          return tensor::sum(all_gather(ctx, t.at("x"), "model", 0, true));
        })(p);
        EXPECT_EQ(g.at("x").to_vector<float>()[0], 4.f);
        // pvary's transpose is psum: a replicated r with per-device weights 1 and 2
        // along "data" has the cotangent 1 + 2 = 3 on both devices.
        TensorTree q;
        q.set("r", Tensor::ones({2, 3}));
        auto g2 = autodiff::grad([&](const TensorTree& t) {
          return tensor::sum(
              tensor::mul_scalar(pvary(ctx, t.at("r"), "data"), axis_index(ctx, "data") + 1));
        })(q);
        EXPECT_EQ(g2.at("r").to_vector<float>()[0], 3.f);
        // psum of the replicated r is 4 r along "model": gradient 4.
        auto g3 = autodiff::grad(
            [&](const TensorTree& t) { return tensor::sum(psum(ctx, t.at("r"), "model")); })(q);
        EXPECT_EQ(g3.at("r").to_vector<float>()[0], 4.f);
        // psum of the varying x: its transpose is the identity.
        auto g4 = autodiff::grad(
            [&](const TensorTree& t) { return tensor::sum(psum(ctx, t.at("x"), "model")); })(p);
        EXPECT_EQ(g4.at("x").to_vector<float>()[0], 1.f);
        std::lock_guard<std::mutex> lock(mu);
        ++checked;
        return std::vector<Tensor>{};
      },
      {}, {});
  f(std::vector<Tensor>{});
  EXPECT_EQ(checked, 8);
}

// "Ring collectives for asynchronous tensor parallelism"
TEST(DocsSpmd, RingCollectivesForAsyncTp) {
  using namespace distjax::spmd;
  Mesh mesh({2, 4}, {"data", "model"});
  std::mutex mu;
  int checked = 0;
  auto f = shard_map(
      mesh,
      [&](DeviceContext& ctx, const std::vector<Tensor>&) {
        const Key key = Key::from_seed(1).fold_in(ctx.device());
        auto random = [&](std::uint64_t i, const Shape& s) {
          Tensor t = Tensor::empty(s);
          random_uniform(key.fold_in(i), t.data<float>(), t.numel(), -1.f, 1.f);
          return pvary(ctx, t, {"data", "model"});
        };
        const Tensor x = random(0, {2, 3}), w = random(1, {3, 5});
        const Tensor h = random(2, {8, 3}), v = random(3, {3, 5});
        // The snippet.
        parallel::RingGather ring(ctx, x, "model");
        std::vector<Tensor> rows(4);
        while (ring.has_next()) {
          parallel::RingChunk c = ring.next();
          rows[c.source] = tensor::matmul(c.value, w);
        }
        Tensor y = tensor::concat(rows, 0);
        Tensor z = parallel::async_scatter(
            ctx,
            [&](int j) { return tensor::matmul(tensor::slice(h, 0, 2 * j, 2 * j + 2), v); },
            "model");
        // What it claims.
        const Tensor y_ref = tensor::matmul(all_gather(ctx, x, "model", 0, true), w);
        const Tensor z_ref = psum_scatter(ctx, tensor::matmul(h, v), "model", 0, true);
        auto expect_near = [](const Tensor& a, const Tensor& b) {
          ASSERT_EQ(a.shape(), b.shape());
          const std::vector<float> va = a.to_vector<float>(), vb = b.to_vector<float>();
          for (std::size_t i = 0; i < va.size(); ++i)
            EXPECT_NEAR(va[i], vb[i], 1e-5);
        };
        EXPECT_EQ(y.shape(), (Shape{8, 5}));
        expect_near(y, y_ref);
        EXPECT_EQ(z.shape(), (Shape{2, 5}));
        expect_near(z, z_ref);
        const int d = axis_index(ctx, "model");
        EXPECT_EQ(parallel::ring_gather_sources(d, 4, parallel::RingMode::Bidirectional),
                  (std::vector<int>{d, (d + 3) % 4, (d + 1) % 4, (d + 2) % 4}));
        std::lock_guard<std::mutex> lock(mu);
        ++checked;
        return std::vector<Tensor>{};
      },
      {}, {});
  f(std::vector<Tensor>{});
  EXPECT_EQ(checked, 8);
}

// "fold_rng_over_axis"
TEST(DocsSpmd, FoldRngOverAxis) {
  using namespace distjax::spmd;
  Mesh mesh({2, 4}, {"data", "model"});
  std::vector<Key> keys(8);
  auto f = shard_map(mesh,
                     [&](DeviceContext& ctx, const std::vector<Tensor>&) {
                       keys[ctx.device()] = fold_rng_over_axis(ctx, Key::from_seed(0), "data");
                       return std::vector<Tensor>{};
                     },
                     {}, {});
  f(std::vector<Tensor>{});
  EXPECT_EQ(keys[0], keys[3]);  // same "data" coordinate
  EXPECT_NE(keys[0], keys[4]);  // different "data" coordinate
}

// "Errors": a collective mismatch and a timeout.
TEST(DocsSpmd, CommErrors) {
  using namespace distjax::spmd;
  Mesh line = Mesh::line(4);
  auto mismatch = shard_map(line,
                            [](DeviceContext& ctx, const std::vector<Tensor>&) {
                              Tensor x = Tensor::ones({4});
                              Tensor y = ctx.device() == 2 ? all_gather(ctx, x, "data", 0, true)
                                                           : psum(ctx, x, "data");
                              return std::vector<Tensor>{y};
                            },
                            {}, {P("data")}, {.timeout = std::chrono::milliseconds(2000)});
  const std::string m1 = error_of<CommError>([&] { mismatch(std::vector<Tensor>{}); });
  EXPECT_TRUE(contains(m1, "devices disagree")) << m1;
  EXPECT_TRUE(contains(m1, "0,1,3")) << m1;
  EXPECT_TRUE(contains(m1, "device 2")) << m1;

  // A device that skips a collective and returns is noticed at once.
  auto skipped = shard_map(line,
                           [](DeviceContext& ctx, const std::vector<Tensor>&) {
                             Tensor x = Tensor::ones({2});
                             if (ctx.device() != 3) x = psum(ctx, x, "data");
                             return std::vector<Tensor>{x};
                           },
                           {}, {P("data")}, {.timeout = std::chrono::milliseconds(300)});
  const std::string m2 = error_of<CommError>([&] { skipped(std::vector<Tensor>{}); });
  EXPECT_TRUE(contains(m2, "device 3 did not arrive (device 3 finished its program)")) << m2;

  // A device that is late (busy elsewhere) past the timeout: the others time out.
  auto late = shard_map(line,
                        [](DeviceContext& ctx, const std::vector<Tensor>&) {
                          if (ctx.device() == 3)
                            std::this_thread::sleep_for(std::chrono::milliseconds(600));
                          return std::vector<Tensor>{psum(ctx, Tensor::ones({2}), "data")};
                        },
                        {}, {P()}, {.timeout = std::chrono::milliseconds(300)});
  const std::string m3 = error_of<CommError>([&] { late(std::vector<Tensor>{}); });
  EXPECT_TRUE(contains(m3, "timed out after 300 ms")) << m3;
  EXPECT_TRUE(contains(m3, "device 3 did not arrive")) << m3;
  std::printf("late: %s\n", m3.c_str());
  std::printf("mismatch: %s\nskipped: %s\n", m1.c_str(), m2.c_str());
}

// "The communicator underneath"
TEST(DocsSpmd, LaunchAndCommunicator) {
  std::vector<float> result(4);
  std::vector<int> row_sizes(4);
  comm::LaunchOptions opts;
  opts.num_devices = 4;  // threads backend by default
  comm::launch(opts, [&](comm::Communicator& world) {
    std::vector<float> x(8, float(world.rank())), y(8);
    world.all_reduce(x.data(), y.data(), 8, DType::F32, comm::ReduceOp::Sum);  // y = 0+1+2+3
    comm::Communicator row = world.split(world.rank() / 2, world.rank());      // {0,1}, {2,3}
    result[world.rank()] = y[0];
    row_sizes[world.rank()] = row.size();
  });
  EXPECT_EQ(result, (std::vector<float>{6, 6, 6, 6}));
  EXPECT_EQ(row_sizes, (std::vector<int>{2, 2, 2, 2}));
}

// "The communicator underneath": tensors through comm::buffer_of
TEST(DocsSpmd, TensorsThroughBufferOf) {
  std::vector<float> sums(2), received(2);
  comm::LaunchOptions opts;
  opts.num_devices = 2;
  comm::launch(opts, [&](comm::Communicator& world) {
    Tensor g = Tensor::full({4}, world.rank() + 1.0),
           out = Tensor::empty(g.shape(), g.dtype(), g.device());
    world.all_reduce(comm::buffer_of(g), comm::buffer_of(out), comm::ReduceOp::Sum);
    Tensor in = Tensor::empty({4});
    comm::Request recv = world.irecv(comm::buffer_of(in), /*src=*/1 - world.rank(), /*tag=*/0);
    comm::Request r = world.isend(comm::buffer_of(g), /*dst=*/1 - world.rank(), /*tag=*/0);
    r.wait();
    recv.wait();
    sums[world.rank()] = out.to_vector<float>()[3];
    received[world.rank()] = in.to_vector<float>()[0];
  });
  EXPECT_EQ(sums, (std::vector<float>{3, 3}));
  EXPECT_EQ(received, (std::vector<float>{2, 1}));
}

// "Link model" and "Counters"
TEST(DocsSpmd, LinkModelAndCounters) {
  using namespace distjax::spmd;
  Mesh mesh = Mesh::line(2);
  std::vector<std::int64_t> bytes(2), data_bytes(2);
  ShardMapOptions opts;
  opts.link = {.latency_us = 50, .bandwidth_gbps = 10};
  opts.on_exit = [&](DeviceContext& ctx) {
    bytes[ctx.device()] = ctx.comm_stats()[comm::OpKind::AllReduce].bytes_sent;
    data_bytes[ctx.device()] = ctx.comm_stats().of("data", comm::OpKind::AllReduce).bytes_sent;
  };
  auto f = shard_map(
      mesh,
      [](DeviceContext& ctx, const std::vector<Tensor>&) {
        return std::vector<Tensor>{psum(ctx, Tensor::ones({1024}), "data")};
      },
      {}, {P()}, opts);
  auto out = f(std::vector<Tensor>{});
  EXPECT_EQ(mesh::gather(out[0]).to_vector<float>()[0], 2.f);
  // Ring all-reduce: 2 (p - 1) / p * 4096 bytes = 4096 bytes sent per device.
  EXPECT_EQ(bytes[0], 4096);
  EXPECT_EQ(bytes[1], 4096);
  EXPECT_EQ(data_bytes, bytes);
}

// ------------------------------------------------------------ training.md

// "Module system"
TEST(DocsTraining, ScopeAndDense) {
  Tensor x = Tensor::ones({2, 784});
  TensorTree params;
  nn::ParamSpecs specs;
  nn::Scope init = nn::Scope::init(&params, Key::from_seed(0), &specs);
  nn::Dense{.features = 512, .kernel_spec = P(std::nullopt, "model")}(init.child("fc1"), x);
  EXPECT_EQ(params.paths(), (std::vector<std::string>{"fc1/bias", "fc1/kernel"}));
  EXPECT_EQ(params.at("fc1/kernel").shape(), (Shape{784, 512}));  // no context: whole
  EXPECT_EQ(specs.at("fc1/kernel"), P(std::nullopt, "model"));

  nn::Scope run = nn::Scope::apply(&params, /*train=*/true, Key::from_seed(1));
  Tensor y = nn::Dense{.features = 512}(run.child("fc1"), x);
  EXPECT_EQ(y.shape(), (Shape{2, 512}));
  // A missing parameter names its path.
  const std::string msg =
      error_of<InvalidArgument>([&] { nn::Dense{.features = 10}(run.child("fc2"), y); });
  EXPECT_TRUE(contains(msg, "fc2/kernel")) << msg;
}

// "Models": Classifier
TEST(DocsTraining, Classifier) {
  models::Classifier model({.in_features = 784, .hidden = 512, .num_classes = 10, .dropout = 0.1f});
  TensorTree params = model.init(Key::from_seed(0));
  EXPECT_EQ(params.paths(),
            (std::vector<std::string>{"fc1/bias", "fc1/kernel", "fc2/bias", "fc2/kernel"}));
  EXPECT_EQ(model.num_params(), params.num_elements());
  EXPECT_EQ(model.num_params(), 784 * 512 + 512 + 512 * 10 + 10);
  Tensor logits = model.apply(params, Tensor::zeros({32, 784}), /*train=*/true, Key::from_seed(1));
  EXPECT_EQ(logits.shape(), (Shape{32, 10}));
}

// "Models": Transformer
TEST(DocsTraining, Transformer) {
  models::Transformer gpt(
      {.vocab = 256, .d_model = 64, .num_layers = 2, .num_heads = 4, .max_len = 32});
  TensorTree params = gpt.init(Key::from_seed(0));
  EXPECT_EQ(gpt.num_params(), params.num_elements());
  EXPECT_TRUE(params.contains("blocks/1/attn/qkv/kernel"));
  EXPECT_EQ(params.at("blocks/1/attn/qkv/kernel").shape(), (Shape{64, 192}));
  EXPECT_TRUE(params.contains("wpe/embedding"));
  EXPECT_FALSE(params.contains("lm_head/kernel"));  // tied
  Tensor tokens = Tensor::zeros({2, 16}, DType::I32);
  Tensor logits = gpt.apply(params, tokens, /*train=*/false, Key{});
  EXPECT_EQ(logits.shape(), (Shape{2, 16, 256}));

}

// "Optimizers", "Schedules", "Clipping"
TEST(DocsTraining, OptimizersSchedulesClipping) {
  auto lr = optim::warmup_cosine_schedule(0.0, 1e-3, 100, 1000);
  EXPECT_DOUBLE_EQ(lr(0), 0.0);
  EXPECT_DOUBLE_EQ(lr(100), 1e-3);
  EXPECT_NEAR(lr(1000), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(optim::linear_schedule(0.0, 0.04, 4)(1), 0.01);

  TensorTree params;
  params.set("fc1/kernel", Tensor::ones({2, 2}));
  params.set("fc1/bias", Tensor::ones({2}));
  optim::AdamW opt({.learning_rate = optim::constant_schedule(0.1),
                    .weight_decay = 0.1,
                    .decay_mask = optim::default_decay_mask()});
  EXPECT_TRUE(opt.decays("fc1/kernel"));
  EXPECT_FALSE(opt.decays("fc1/bias"));
  TensorTree state = opt.init(params);
  EXPECT_TRUE(state.contains("mu/fc1/kernel"));
  EXPECT_TRUE(state.contains("nu/fc1/bias"));
  TensorTree grads = params.map([](const Tensor& t) { return Tensor::ones(t.shape()); });
  opt.update(params, grads, state, /*step=*/0);
  // First AdamW step: p = 1 * (1 - 0.1 * 0.1) - 0.1 * 1 / (1 + eps) = 0.89 (decayed),
  // 0.9 (bias, not decayed).
  EXPECT_NEAR(params.at("fc1/kernel").to_vector<float>()[0], 0.89f, 1e-6);
  EXPECT_NEAR(params.at("fc1/bias").to_vector<float>()[0], 0.9f, 1e-6);

  optim::SGD sgd({.learning_rate = optim::constant_schedule(0.01), .momentum = 0.9});
  EXPECT_TRUE(sgd.init(params).contains("momentum/fc1/kernel"));
  EXPECT_TRUE(optim::SGD({}).init(params).empty());

  TensorTree g;
  g.set("a", Tensor::from_vector<float>({3.f, 4.f}, {2}));
  double norm = optim::clip_by_global_norm(g, 1.0);  // returns 5, scales g to norm 1
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_NEAR(optim::global_norm(g), 1.0, 1e-6);
}

namespace {

// A softmax-regression loss function of the train::LossFn contract.
std::pair<Tensor, train::Metrics> linear_loss(const TensorTree& p, const train::Batch& b, Key) {
  Tensor logits = tensor::linear(b.inputs, p.at("w"), p.at("b"));
  Tensor loss = tensor::mean(tensor::cross_entropy(logits, b.labels));
  train::Metrics m;
  const auto pred = tensor::argmax(logits.detach(), -1).to_vector<std::int64_t>();
  const auto y = b.labels.to_vector<std::int32_t>();
  double correct = 0;
  for (std::size_t i = 0; i < y.size(); ++i)
    correct += pred[i] == y[i];
  m.add("accuracy", correct, static_cast<double>(y.size()));
  return {loss, m};
}

}  // namespace

// "TrainState and train_step", "Gradient accumulation"
TEST(DocsTraining, TrainStepAndAccumulation) {
  data::ArrayDataset d = data::synthetic_classification(256, 8, 4, Key::from_seed(1));
  TensorTree params;
  params.set("w", Tensor::zeros({8, 4}));
  params.set("b", Tensor::zeros({4}));
  optim::Adam opt({.learning_rate = optim::constant_schedule(0.05)});
  train::TrainState state = train::TrainState::create(params, opt, Key::from_seed(0));

  data::DataLoader loader(d, {.batch_size = 64, .seed = 0});
  train::Metrics first, last;
  for (int s = 0; s < 40; ++s) {
    train::Metrics m = train::train_step(state, loader.next(), linear_loss, opt,
                                         {.num_minibatches = 4, .max_grad_norm = 1.0});
    (s == 0 ? first : last) = m;
  }
  EXPECT_EQ(state.step, 40);
  EXPECT_LT(last.mean("loss"), first.mean("loss"));
  EXPECT_TRUE(last.contains("grad_norm"));
  EXPECT_TRUE(last.contains("learning_rate"));
  train::Metrics eval = train::evaluate(state.params, d.batches(128), linear_loss, Key{});
  EXPECT_GT(eval.mean("accuracy"), 0.8);

  // Accumulating over 4 slices gives the full-batch gradient of a mean loss.
  train::Batch batch = d.slice(0, 64);
  auto full = train::accumulate_gradients(linear_loss, state.params, batch, Key{}, 1);
  auto acc = train::accumulate_gradients(linear_loss, state.params, batch, Key{}, 4);
  auto a = full.grads.at("w").to_vector<float>(), b = acc.grads.at("w").to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-5);
  EXPECT_NEAR(full.metrics.mean("loss"), acc.metrics.mean("loss"), 1e-5);
}

// "Mixed precision"
TEST(DocsTraining, MixedPrecision) {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "mixed precision keeps f32 master weights. ";
  const data::ByteCorpus corpus =
      data::ByteCorpus::from_bytes(std::vector<std::uint8_t>(text.begin(), text.end()));
  const train::Batch batch = data::sample_windows(corpus.train, 4, 32, Key::from_seed(3));

  models::Transformer gpt(
      {.vocab = 256, .d_model = 64, .num_layers = 2, .num_heads = 4, .max_len = 32});
  auto loss_in = [&](nn::Precision policy) -> train::LossFn {
    return [&gpt, policy](const TensorTree& p, const train::Batch& b, Key k) {
      nn::Scope s = nn::Scope::apply(&p, /*train=*/true, k).with_precision(policy);
      return std::make_pair(gpt.loss(s, b.inputs, b.labels), train::Metrics{});
    };
  };
  optim::AdamW opt({.learning_rate = optim::constant_schedule(1e-3)});
  train::TrainState state =
      train::TrainState::create(gpt.init(Key::from_seed(0)), opt, Key::from_seed(1));
  train::train_step(state, batch, loss_in(nn::Precision::bf16()), opt);
  EXPECT_EQ(state.params.at("wte/embedding").dtype(), DType::F32);

  state.loss_scale = train::DynamicLossScale{.scale = 32768, .growth_interval = 2000};
  train::Metrics m = train::train_step(state, batch, loss_in(nn::Precision::fp16()), opt);
  EXPECT_EQ(m.mean("loss_scale"), 32768);
  EXPECT_EQ(m.mean("skipped_steps"), 0);
  EXPECT_TRUE(std::isfinite(m.mean("loss")));
  for (const auto& [path, t] : state.opt_state)
    EXPECT_EQ(t.dtype(), DType::F32) << path;
}

// "Trainer and its output files"
TEST(DocsTraining, TrainerFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "distjax_docs_trainer";
  fs::remove_all(dir);
  data::ArrayDataset d = data::synthetic_classification(64, 6, 3, Key::from_seed(1));
  data::DataLoader loader(d, {.batch_size = 16, .seed = 3});
  optim::AdamW opt({.learning_rate = optim::constant_schedule(0.01)});
  TensorTree params;
  params.set("w", Tensor::zeros({6, 3}));
  params.set("b", Tensor::zeros({3}));
  train::TrainState state = train::TrainState::create(params, opt, Key::from_seed(0));

  train::Trainer trainer(
      {.out_dir = dir.string(), .total_steps = 4, .log_every = 2, .print = false}, opt,
      linear_loss);
  for (int s = 0; s < 4; ++s)
    trainer.step(state, loader.next());
  trainer.evaluate(state, d.batches(32));
  trainer.finish(state, {{"test_accuracy", trainer.last_eval().at("accuracy")}});

  std::ifstream f(dir / "metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(f, line);)
    lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);  // steps 2 and 4, then the evaluation
  for (const char* k : {"step", "loss", "accuracy", "learning_rate", "grad_norm", "throughput",
                        "throughput_unit", "elapsed_s"})
    EXPECT_TRUE(lines[0].contains(k)) << k;
  EXPECT_EQ(lines[0]["throughput_unit"], "examples/s");
  for (const char* k : {"step", "eval_loss", "eval_accuracy", "elapsed_s"})
    EXPECT_TRUE(lines[2].contains(k)) << k;
  std::ifstream sf(dir / "summary.json");
  nlohmann::json s = nlohmann::json::parse(sf);
  for (const char* k :
       {"steps", "wall_time_s", "train_time_s", "throughput", "throughput_unit", "examples_seen",
        "optimizer", "num_parameters", "mesh", "backend", "final_metrics", "test_accuracy"})
    EXPECT_TRUE(s.contains(k)) << k;
  EXPECT_TRUE(s["final_metrics"].contains("train_loss"));
  EXPECT_TRUE(s["final_metrics"].contains("eval_accuracy"));
  fs::remove_all(dir);
}

// "Data"
TEST(DocsTraining, DataLoaderSharding) {
  data::ArrayDataset d = data::synthetic_classification(100, 4, 3, Key::from_seed(0));
  EXPECT_EQ(d.size(), 100);
  data::DataLoader loader(d, {.batch_size = 32, .seed = 0, .num_shards = 2, .shard_index = 1});
  EXPECT_EQ(loader.batches_per_epoch(), 3);  // drop_last
  train::Batch b = loader.next();            // rows 16..32 of the global batch
  EXPECT_EQ(b.inputs.shape(), (Shape{16, 4}));
  EXPECT_EQ(b.labels.dtype(), DType::I32);
  data::LoaderPosition pos = loader.position();  // {epoch 0, batch 1}
  train::Batch next = loader.next();
  data::DataLoader resumed(d, loader.config());
  resumed.seek(pos);
  EXPECT_EQ(resumed.next().labels.to_vector<std::int32_t>(), next.labels.to_vector<std::int32_t>());

  std::vector<std::uint8_t> text(1000);
  for (std::size_t i = 0; i < text.size(); ++i)
    text[i] = static_cast<std::uint8_t>('a' + i % 26);
  data::ByteCorpus corpus = data::ByteCorpus::from_bytes(text, 0.1);
  EXPECT_EQ(corpus.validation.size(), 100u);
  train::Batch w = data::sample_windows(corpus.train, 8, 16, Key::from_seed(0));
  EXPECT_EQ(w.inputs.shape(), (Shape{8, 16}));
  auto xi = w.inputs.to_vector<std::int32_t>(), yi = w.labels.to_vector<std::int32_t>();
  EXPECT_EQ(xi[1], yi[0]);  // labels are the inputs shifted by one
  EXPECT_EQ(data::sequential_windows(corpus.validation, 2, 16, 0).size(), 3u);
}
