// Every differentiable collective on every test mesh and over single axes, all axes and
// a set of axes out of mesh order: values against a host computation, and gradients
// (value_and_grad inside each device) against value_and_grad of the equivalent
// single-device program.
#include "distjax/spmd/collectives.hpp"

#include <gtest/gtest.h>

#include <functional>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/comm/launch.hpp"
#include "distjax/spmd/ppermute.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/reduce.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "spmd/spmd_test_util.hpp"

using namespace distjax;
using namespace distjax::spmd;
using distjax::testing::expect_close;
using distjax::testing::random_tensor;
using mesh::P;
using tensor::TensorTree;

namespace {

/// One collective under test.
struct OpCase {
  std::string name;
  /// The input is equal along the axes (pvary): the host program has one x per group.
  bool replicated_in = false;
  /// The output is replicated (psum/pmean/pmax): the host objective counts it once.
  bool replicated_out = false;
  /// Local input shape for a group of n devices.
  std::function<Shape(int n)> in_shape;
  std::function<Tensor(DeviceContext&, const Tensor&, const Axes&)> device_op;
  /// The same computation on the host, differentiable: inputs of the group's devices in
  /// group order, and this device's index in the group.
  std::function<Tensor(const std::vector<Tensor>&, int idx)> host_op;
};

Tensor host_sum(const std::vector<Tensor>& xs) {
  Tensor s = xs[0];
  for (std::size_t i = 1; i < xs.size(); ++i)
    s = tensor::add(s, xs[i]);
  return s;
}

std::vector<OpCase> op_cases() {
  using V = std::vector<Tensor>;
  std::vector<OpCase> c;
  c.push_back({"psum", false, true,
               [](int) {
                 return Shape{3, 2};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) { return psum(ctx, x, a); },
               [](const V& xs, int) { return host_sum(xs); }});
  c.push_back({"pmean", false, true,
               [](int) {
                 return Shape{3, 2};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) { return pmean(ctx, x, a); },
               [](const V& xs, int) {
                 return tensor::mul_scalar(host_sum(xs), 1.0 / static_cast<double>(xs.size()));
               }});
  c.push_back({"pmax", false, true,
               [](int) {
                 return Shape{3, 2};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) { return pmax(ctx, x, a); },
               [](const V& xs, int) { return tensor::max(tensor::stack(xs, 0), {0}); }});
  c.push_back({"all_gather(dim 0, tiled)", false, false,
               [](int) {
                 return Shape{2, 3};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 return all_gather(ctx, x, a, 0, true);
               },
               [](const V& xs, int) { return tensor::concat(xs, 0); }});
  c.push_back({"all_gather(dim 1, stacked)", false, false,
               [](int) {
                 return Shape{2, 3};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 return all_gather(ctx, x, a, 1, false);
               },
               [](const V& xs, int) { return tensor::stack(xs, 1); }});
  c.push_back({"psum_scatter(dim 0, tiled)", false, false,
               [](int n) {
                 return Shape{2 * n, 3};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 return psum_scatter(ctx, x, a, 0, true);
               },
               [](const V& xs, int idx) {
                 return tensor::split(host_sum(xs), static_cast<int>(xs.size()), 0)[idx];
               }});
  c.push_back({"psum_scatter(dim 1, untiled)", false, false,
               [](int n) {
                 return Shape{2, n};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 return psum_scatter(ctx, x, a, 1, false);
               },
               [](const V& xs, int idx) {
                 return tensor::reshape(tensor::slice(host_sum(xs), 1, idx, idx + 1), {2});
               }});
  c.push_back({"ppermute(ring +1)", false, false,
               [](int) {
                 return Shape{2, 3};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 return ppermute(ctx, x, a, ring_permutation(ctx.axis_size(a), 1));
               },
               [](const V& xs, int idx) {
                 const int n = static_cast<int>(xs.size());
                 return tensor::mul_scalar(xs[(idx - 1 + n) % n], 1.0);
               }});
  c.push_back({"all_to_all(split 0, concat 1)", false, false,
               [](int n) {
                 return Shape{2 * n, 3};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 return all_to_all(ctx, x, a, 0, 1);
               },
               [](const V& xs, int idx) {
                 V chunks;
                 for (const auto& x : xs)
                   chunks.push_back(tensor::split(x, static_cast<int>(xs.size()), 0)[idx]);
                 return tensor::concat(chunks, 1);
               }});
  c.push_back({"pvary", true, false,
               [](int) {
                 return Shape{3, 2};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) { return pvary(ctx, x, a); },
               [](const V& xs, int idx) { return tensor::mul_scalar(xs[idx], 1.0); }});
  // The varying-axes rules: the cases the transposes used to get wrong.
  c.push_back({"all_gather_invariant(dim 0, tiled)", false, true,
               [](int) {
                 return Shape{2, 3};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 return all_gather_invariant(ctx, x, a, 0, true);
               },
               [](const V& xs, int) { return tensor::concat(xs, 0); }});
  c.push_back({"all_gather_invariant(dim 1, stacked)", false, true,
               [](int) {
                 return Shape{2, 3};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 return all_gather_invariant(ctx, x, a, 1, false);
               },
               [](const V& xs, int) { return tensor::stack(xs, 1); }});
  c.push_back({"psum of a replicated input (n x)", true, true,
               [](int) {
                 return Shape{3, 2};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) { return psum(ctx, x, a); },
               [](const V& xs, int) { return host_sum(xs); }});
  c.push_back({"psum(pmean(x))", false, true,
               [](int) {
                 return Shape{3, 2};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 return psum(ctx, pmean(ctx, x, a), a);
               },
               [](const V& xs, int) { return host_sum(xs); }});
  c.push_back({"psum(psum(x))", false, true,
               [](int) {
                 return Shape{3, 2};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 return psum(ctx, psum(ctx, x, a), a);
               },
               [](const V& xs, int) {
                 return tensor::mul_scalar(host_sum(xs), static_cast<double>(xs.size()));
               }});
  c.push_back({"pmax of a replicated input", true, true,
               [](int) {
                 return Shape{3, 2};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) { return pmax(ctx, x, a); },
               [](const V& xs, int) { return tensor::max(tensor::stack(xs, 0), {0}); }});
  c.push_back({"pvary of a varying input (identity)", false, false,
               [](int) {
                 return Shape{3, 2};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) { return pvary(ctx, x, a); },
               [](const V& xs, int idx) { return tensor::mul_scalar(xs[idx], 1.0); }});
  c.push_back({"all_gather into a replicated loss (psum of the gathered sum)", false, true,
               [](int) {
                 return Shape{2, 3};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 // sum over the group of the (varying) gathered copies: n * concat
                 return psum(ctx, all_gather(ctx, x, a, 0, true), a);
               },
               [](const V& xs, int) {
                 return tensor::mul_scalar(tensor::concat(xs, 0), static_cast<double>(xs.size()));
               }});
  c.push_back({"elementwise mix of replicated and varying (implicit pvary)", true, false,
               [](int) {
                 return Shape{3, 2};
               },
               [](DeviceContext& ctx, const Tensor& x, const Axes& a) {
                 // x is replicated along a; the scale varies: the tape must sum x's cotangent.
                 Tensor scale = pvary(ctx, Tensor::full(x.shape(), 1.0 + axis_index(ctx, a)), a);
                 return tensor::mul(x, scale);
               },
               [](const V& xs, int idx) { return tensor::mul_scalar(xs[idx], 1.0 + idx); }});
  return c;
}

/// The axis sets to test on a mesh: each axis, all axes, and all axes reversed.
std::vector<Axes> axis_sets(const Mesh& m) {
  std::vector<Axes> out;
  for (const auto& a : m.axis_names())
    out.push_back(Axes(a));
  if (m.ndim() > 1) {
    out.push_back(Axes(m.axis_names()));
    std::vector<std::string> rev(m.axis_names().rbegin(), m.axis_names().rend());
    out.push_back(Axes(rev));
  }
  return out;
}

Tensor add_lead(const Tensor& t) {
  Shape s = t.shape();
  s.insert(s.begin(), 1);
  return t.view(s);
}

Tensor drop_lead(const Tensor& t) {
  Shape s(t.shape().begin() + 1, t.shape().end());
  return t.view(s);
}

void run_case(const OpCase& op, const Mesh& m, const Axes& axes) {
  SCOPED_TRACE(op.name + " on mesh " + m.describe() + " over " + axes.str());
  const int D = m.size();
  const int n = m.axes_size(axes);
  const Shape in_shape = op.in_shape(n);
  const Key kx = Key::from_seed(11), kw = Key::from_seed(23);
  auto in_id = [&](int d) { return op.replicated_in ? m.group_id(d, axes) : d; };
  auto w_id = [&](int d) { return op.replicated_out ? m.group_id(d, axes) : d; };

  // Host program: one parameter per distinct input.
  TensorTree host_params;
  for (int d = 0; d < D; ++d)
    host_params.set("x/" + std::to_string(in_id(d)), random_tensor(kx.fold_in(in_id(d)), in_shape));
  auto group_inputs = [&](const TensorTree& p, int d) {
    std::vector<Tensor> xs;
    for (int g : m.group(d, axes))
      xs.push_back(p.at("x/" + std::to_string(in_id(g))));
    return xs;
  };
  std::vector<Tensor> host_y(D), w(D);
  for (int d = 0; d < D; ++d) {
    host_y[d] = op.host_op(group_inputs(host_params, d), m.index_along(d, axes));
    w[d] = random_tensor(kw.fold_in(w_id(d)), host_y[d].shape());
  }
  auto host_loss = [&](const TensorTree& p) {
    Tensor total = Tensor::scalar(0.0);
    for (int d = 0; d < D; ++d) {
      if (op.replicated_out && m.index_along(d, axes) != 0) continue;  // counted once per group
      Tensor y = op.host_op(group_inputs(p, d), m.index_along(d, axes));
      total = tensor::add(total, tensor::sum(tensor::mul(tensor::mul(y, y), w[d])));
    }
    return total;
  };
  auto [host_total, host_grads] = autodiff::value_and_grad(host_loss)(host_params);

  // Device program: inputs and weights stacked over devices, split over all axes.
  std::vector<Tensor> xs, ws;
  for (int d = 0; d < D; ++d) {
    xs.push_back(host_params.at("x/" + std::to_string(in_id(d))));
    ws.push_back(w[d]);
  }
  const P all_axes = P(m.axis_names());
  auto f = shard_map(m,
                     [&](DeviceContext& ctx, const std::vector<Tensor>& in) {
                       Tensor x = drop_lead(in[0]), wd = drop_lead(in[1]);
                       // The host program has one x per group when the input is
                       // replicated, and counts a replicated output once per group: say
                       // the same here (the values are already equal along `axes`; pmean
                       // marks them replicated).
                       if (op.replicated_in) x = pmean(ctx, x, axes);
                       if (op.replicated_out) wd = pmean(ctx, wd, axes);
                       Tensor y_out;
                       TensorTree params;
                       params.set("x", x);
                       auto [loss, g] = autodiff::value_and_grad([&](const TensorTree& p) {
                         Tensor y = op.device_op(ctx, p.at("x"), axes);
                         y_out = y.detach();
                         return tensor::sum(tensor::mul(tensor::mul(y, y), wd));
                       })(params);
                       return std::vector<Tensor>{add_lead(y_out), add_lead(g.at("x"))};
                     },
                     {all_axes, all_axes}, {all_axes, all_axes},
                     {.timeout = std::chrono::milliseconds(10000)});
  auto out = f(std::vector<Tensor>{tensor::stack(xs, 0), tensor::stack(ws, 0)});
  ASSERT_EQ(out.size(), 2u);
  for (int d = 0; d < D; ++d) {
    const std::string dev = "device " + std::to_string(d);
    expect_close(drop_lead(out[0].shard(d)), host_y[d].detach(), 1e-5,
                 op.name + " value on " + dev);
    expect_close(drop_lead(out[1].shard(d)), host_grads.at("x/" + std::to_string(in_id(d))), 1e-5,
                 op.name + " gradient on " + dev);
  }
}

}  // namespace

class CollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveTest, ValuesAndGradientsMatchSingleDevice) {
  const OpCase op = op_cases()[GetParam()];
  for (const Mesh& m : distjax::testing::test_meshes())
    for (const Axes& axes : axis_sets(m))
      run_case(op, m, axes);
}

INSTANTIATE_TEST_SUITE_P(AllOps, CollectiveTest,
                         ::testing::Range(0, static_cast<int>(op_cases().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           std::string s = op_cases()[info.param].name;
                           std::string out;
                           for (char ch : s)
                             out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return out;
                         });

TEST(Collectives, PmaxGradientGoesToTheFirstDeviceOnTies) {
  Mesh m = Mesh::line(4);
  auto f = shard_map(
      m,
      [](DeviceContext& ctx, const std::vector<Tensor>&) {
        // Devices 1 and 3 tie for the max of element 0; device 2 holds the max of element 1.
        const int i = ctx.axis_index("data");
        // A per-device value: pvary says so (it is not replicated along "data").
        Tensor x = pvary(
            ctx, Tensor::from_vector<float>({i % 2 == 1 ? 5.f : 1.f, i == 2 ? 7.f : 0.f}, {2}),
            "data");
        TensorTree p;
        p.set("x", x);
        auto g = autodiff::grad(
            [&](const TensorTree& t) { return tensor::sum(pmax(ctx, t.at("x"), "data")); })(p);
        return std::vector<Tensor>{g.at("x")};
      },
      {}, {P("data")});
  Tensor g = mesh::gather(f(std::vector<Tensor>{})[0]);
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{0, 0, 1, 0, 0, 1, 0, 0}));
}

TEST(Collectives, AllGatherGradientEqualsUnshardedLossGradientFsdpStyle) {
  // FSDP: W (8, 3) sharded over "data"; each device multiplies the gathered W by its own
  // batch slice; the objective is the sum of the per-device losses. The gradient each
  // device gets for its shard must equal the slice of the unsharded gradient.
  Mesh m({2, 4}, {"data", "model"});
  const Axes all{"data", "model"};
  Tensor W = random_tensor(Key::from_seed(1), {8, 3});
  Tensor X = random_tensor(Key::from_seed(2), {16, 8});
  auto f = shard_map(m,
                     [&](DeviceContext& ctx, const std::vector<Tensor>& in) {
                       TensorTree p;
                       p.set("w", in[0]);
                       auto g = autodiff::grad([&](const TensorTree& t) {
                         Tensor full = all_gather(ctx, t.at("w"), all, 0, true);
                         Tensor y = tensor::tanh(tensor::matmul(in[1], full));
                         return tensor::sum(tensor::mul(y, y));
                       })(p);
                       return std::vector<Tensor>{g.at("w")};
                     },
                     {P({"data", "model"}), P({"data", "model"})}, {P({"data", "model"})});
  Tensor dw = mesh::gather(f(std::vector<Tensor>{W, X})[0]);
  TensorTree hp;
  hp.set("w", W);
  auto hg = autodiff::grad([&](const TensorTree& t) {
    Tensor y = tensor::tanh(tensor::matmul(X, t.at("w")));
    return tensor::sum(tensor::mul(y, y));
  })(hp);
  expect_close(dw, hg.at("w"), 1e-5, "FSDP gradient");
}

TEST(Collectives, PsumScatterGradientIsAllGatherAndPpermuteGradientIsInverse) {
  // Seeding the cotangent directly: d/dx <psum_scatter(x), c> = all_gather(c), and
  // d/dx <ppermute(x, p), c> = ppermute(c, p^-1).
  Mesh m = Mesh::line(4);
  auto f = shard_map(
      m,
      [](DeviceContext& ctx, const std::vector<Tensor>&) {
        const int i = ctx.axis_index("data");
        Tensor x = pvary(ctx, Tensor::zeros({4}), "data");  // one x per device
        Tensor c = Tensor::full({1}, 10.0 * (i + 1));
        Tensor c2 = Tensor::full({4}, 100.0 * (i + 1));
        TensorTree p;
        p.set("x", x);
        auto g1 = autodiff::grad([&](const TensorTree& t) {
          return tensor::sum(tensor::mul(psum_scatter(ctx, t.at("x"), "data", 0, true), c));
        })(p);
        const std::vector<std::pair<int, int>> perm = {{0, 2}, {2, 3}, {3, 1}, {1, 0}};
        auto g2 = autodiff::grad([&](const TensorTree& t) {
          return tensor::sum(tensor::mul(ppermute(ctx, t.at("x"), "data", perm), c2));
        })(p);
        return std::vector<Tensor>{g1.at("x"), g2.at("x")};
      },
      {}, {P("data"), P("data")});
  auto out = f(std::vector<Tensor>{});
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(out[0].shard(d).to_vector<float>(), (std::vector<float>{10, 20, 30, 40}));
  }
  // Device s's gradient is the cotangent of its destination: 0->2, 2->3, 3->1, 1->0.
  EXPECT_EQ(out[1].shard(0).to_vector<float>()[0], 300.f);
  EXPECT_EQ(out[1].shard(2).to_vector<float>()[0], 400.f);
  EXPECT_EQ(out[1].shard(3).to_vector<float>()[0], 200.f);
  EXPECT_EQ(out[1].shard(1).to_vector<float>()[0], 100.f);
}

namespace {

// The collectives move each device's own tensors wherever they live: on the checked device
// (memory the host reaches only through the kernel table or a HostAccess) psum, pmean,
// pmax (with the owner masks its transpose keeps, computed in the forward), all_gather,
// psum_scatter and ppermute give the values they give on the CPU.
TEST(Collectives, ForwardValuesOnTheCheckedDevice) {
  const Mesh mesh = Mesh::line(4);
  comm::LaunchOptions lo;
  lo.num_devices = 4;
  lo.device = Device{DeviceKind::Checked, 0};
  comm::launch(lo, [&](comm::Communicator& world) {
    DeviceContext ctx(mesh, world);
    const auto i = static_cast<float>(ctx.axis_index("data"));
    const Tensor x = tensor::make_leaf(Tensor::from_vector<float>({i, 1.f, -i, 2.f}, {4}));
    ASSERT_EQ(x.device().kind, DeviceKind::Checked);
    EXPECT_EQ(psum(ctx, x, "data").to_vector<float>(), (std::vector<float>{6, 4, -6, 8}));
    EXPECT_EQ(pmean(ctx, x, "data").to_vector<float>(), (std::vector<float>{1.5, 1, -1.5, 2}));
    EXPECT_EQ(pmax(ctx, x, "data").to_vector<float>(), (std::vector<float>{3, 1, 0, 2}));
    EXPECT_EQ(all_gather(ctx, x, "data", 0, true).to_vector<float>()[12], 3.f);
    EXPECT_EQ(psum_scatter(ctx, x, "data", 0, true).to_vector<float>(),
              (std::vector<float>{i == 0   ? 6.f
                                  : i == 1 ? 4.f
                                  : i == 2 ? -6.f
                                           : 8.f}));
    const float left = static_cast<float>((static_cast<int>(i) + 3) % 4);
    EXPECT_EQ(ppermute(ctx, x, "data", ring_permutation(4)).to_vector<float>(),
              (std::vector<float>{left, 1.f, -left, 2.f}));
  });
}

}  // namespace
