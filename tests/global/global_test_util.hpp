// Helpers of the global-view tests: random host tensors, placing a host tensor as a
// GlobalArray on a device (partial sums split unevenly), running a function per device.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "distjax/core/prng.hpp"
#include "distjax/global/comm_plan.hpp"
#include "distjax/global/global_array.hpp"
#include "distjax/mesh/named_sharding.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/spmd/shard_map.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::testing {

using global::GlobalArray;
using global::GlobalSharding;
using mesh::P;
using tensor::Tensor;

inline Tensor randn(const Shape& s, std::uint64_t seed, double scale = 1.0) {
  std::vector<float> v(static_cast<std::size_t>(distjax::numel(s)));
  random_normal(Key::from_seed(seed), v.data(), static_cast<std::int64_t>(v.size()));
  const Tensor t = Tensor::from_vector(v, s);  // filled on the host, then copied to the device
  return scale == 1.0 ? t : tensor::mul_scalar(t, scale);
}

/// This device's block of `host` under `s`; along partial axes device j of n holds the
/// share 2 (j + 1) / (n (n + 1)) of it (the shares sum to one).
inline GlobalArray place(spmd::DeviceContext& ctx, const Tensor& host, const GlobalSharding& s) {
  const mesh::NamedSharding ns(ctx.mesh(), s.spec);
  Tensor t = host;
  const auto range = ns.shard_range(host.shape(), ctx.device());
  for (std::size_t d = 0; d < range.size(); ++d)
    t = tensor::slice(t, static_cast<int>(d), range[d].first, range[d].second);
  t = t.clone();
  if (!s.partial.empty()) {
    const mesh::Axes axes(s.partial);
    const double n = ctx.axis_size(axes), j = ctx.axis_index(axes);
    t = tensor::mul_scalar(t, 2.0 * (j + 1) / (n * (n + 1)));
  }
  return GlobalArray(ctx, t, host.shape(), s);
}

/// The whole value of `x` (a collective: every device calls it).
inline Tensor to_host(const GlobalArray& x) {
  return global::replicate(x).local().detach().clone();
}

/// Runs fn once per device of `mesh` (threads backend).
inline void run_devices(const mesh::Mesh& mesh,
                        const std::function<void(spmd::DeviceContext&)>& fn) {
  auto f = spmd::shard_map(mesh,
                           [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
                             fn(ctx);
                             return std::vector<Tensor>{};
                           },
                           {}, {});
  f(std::vector<Tensor>{});
}

/// max |a - b| / max(max |b|, 1e-12).
inline double rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return 1e9;
  const auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  double m = 0, s = 1e-12;
  for (std::size_t i = 0; i < va.size(); ++i) {
    m = std::max(m, static_cast<double>(std::fabs(va[i] - vb[i])));
    s = std::max(s, static_cast<double>(std::fabs(vb[i])));
  }
  return m / s;
}

/// The forward collectives of a plan as "kind@axes" strings.
inline std::vector<std::string> forward_collectives(const global::PlanRecorder& plan) {
  std::vector<std::string> out;
  for (const auto& e : plan.entries())
    if (e.phase == global::PlanEntry::Phase::Forward) out.push_back(e.collective + "@" + e.axes);
  return out;
}

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v)
    s += (s.empty() ? "" : " ") + x;
  return s;
}

}  // namespace distjax::testing

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/global/elementwise.hpp"
#include "distjax/global/program.hpp"
#include "distjax/global/reduce.hpp"
#include "distjax/tensor/reduce.hpp"

namespace distjax::testing {

/// One row of a rule table: inputs (host values and shardings), the global-view op and
/// the same op on one device, the output sharding and forward collectives expected.
struct OpCase {
  std::string name;
  std::vector<Tensor> inputs;
  std::vector<GlobalSharding> shardings;
  std::function<GlobalArray(const std::vector<GlobalArray>&)> op;
  std::function<Tensor(const std::vector<Tensor>&)> reference;
  GlobalSharding out;
  std::string collectives;  // forward, "kind@axes" joined by spaces
  bool check_grad = true;
};

/// Runs every case on `mesh`: output sharding and value, the forward collectives of the
/// plan, and the gradients of sum(op(inputs) * r) for every f32 input against one device.
inline void check_op_cases(const mesh::Mesh& mesh, const std::vector<OpCase>& cases,
                           double tol = 1e-5) {
  std::vector<std::string> failures(cases.size());
  std::mutex mu;
  run_devices(mesh, [&](spmd::DeviceContext& ctx) {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const OpCase& c = cases[i];
      std::string why;
      std::vector<GlobalArray> xs;
      for (std::size_t j = 0; j < c.inputs.size(); ++j)
        xs.push_back(place(ctx, c.inputs[j], c.shardings[j]));
      global::PlanRecorder plan;
      GlobalArray y;
      {
        global::RecordPlan on(plan);
        y = c.op(xs);
      }
      if (!(y.sharding() == c.out.normalized(y.rank(), ctx.mesh())))
        why += " sharding " + y.sharding().to_string();
      if (join(forward_collectives(plan)) != c.collectives)
        why += " collectives [" + join(forward_collectives(plan)) + "]";
      const Tensor want = c.reference(c.inputs);
      if (rel_diff(to_host(y), want) > tol) why += " value";
      if (c.check_grad && y.dtype() == DType::F32) {
        const Tensor r = randn(want.shape(), 99);
        const GlobalArray rr = place(ctx, r, GlobalSharding{y.sharding().spec});
        global::GlobalTree params;
        tensor::TensorTree host;
        for (std::size_t j = 0; j < xs.size(); ++j)
          if (xs[j].dtype() == DType::F32) {
            params.emplace(std::to_string(j), xs[j]);
            host.set(std::to_string(j), c.inputs[j]);
          }
        auto [loss, grads] = global::value_and_grad(
            [&](const global::GlobalTree& p) {
              std::vector<GlobalArray> in = xs;
              for (const auto& [k, v] : p)
                in[std::stoul(k)] = v;
              return global::sum(global::mul(c.op(in), rr));
            },
            params);
        auto [ref_loss, ref_grads] = autodiff::value_and_grad([&](const tensor::TensorTree& p) {
          std::vector<Tensor> in = c.inputs;
          for (const auto& [k, v] : p)
            in[std::stoul(k)] = v;
          return tensor::sum(tensor::mul(c.reference(in), r));
        })(host);
        for (const auto& [k, g] : grads) {
          const GlobalArray whole(ctx, g.local(), g.shape(), GlobalSharding{g.sharding().spec});
          if (rel_diff(to_host(whole), ref_grads.at(k)) > tol) why += " gradient " + k;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!why.empty() && failures[i].empty())
        failures[i] = "device " + std::to_string(ctx.device()) + ":" + why;
    }
  });
  for (std::size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(failures[i], "") << cases[i].name;
}

}  // namespace distjax::testing
