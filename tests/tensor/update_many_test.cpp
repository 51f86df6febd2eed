// The multi-leaf update ops (tensor/detail/update_many.hpp) against the per-leaf ones
// (tensor/update_ops.hpp): the same bits in every parameter and state tensor, over leaves of
// odd sizes (an empty one, one larger than a GPU chunk of 65536 elements), on one device and
// split over two; and every leaf checked before any is updated.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "distjax/distjax.hpp"
#include "distjax/tensor/update_ops.hpp"
#include "grad_check.hpp"

namespace distjax::tensor {
namespace {

using testing::uniform;

// Empty leaves in the middle, not last: a kernel that skipped the last leaf would pass.
const std::vector<Shape> kShapes{{3, 17}, {0}, {70001}, {1}, {2, 0, 3}, {129}, {4, 4, 5}};

// A leaf's tensors: parameter, gradient, two state tensors.
struct Leaf {
  Tensor p, g, m, v;
};

// Fresh leaves of kShapes, the i-th on devices[i % size] (m, v: small, v >= 0).
std::vector<Leaf> make_leaves(const std::vector<Device>& devices, std::uint64_t seed) {
  std::vector<Leaf> leaves;
  for (std::size_t i = 0; i < kShapes.size(); ++i) {
    const Shape& s = kShapes[i];
    const Device d = devices[i % devices.size()];
    leaves.push_back({uniform(s, seed + 4 * i).to(d), uniform(s, seed + 4 * i + 1).to(d),
                      uniform(s, seed + 4 * i + 2, -0.1f, 0.1f).to(d),
                      uniform(s, seed + 4 * i + 3, 0.f, 0.01f).to(d)});
  }
  return leaves;
}

std::vector<Leaf> clone(const std::vector<Leaf>& leaves) {
  std::vector<Leaf> out;
  for (const Leaf& l : leaves)
    out.push_back({l.p.clone(), l.g.clone(), l.m.clone(), l.v.clone()});
  return out;
}

// got and want hold the same f32 bits (the first difference named otherwise).
::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want) {
  const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  if (g.size() != w.size())
    return ::testing::AssertionFailure() << g.size() << " vs " << w.size() << " elements";
  for (std::size_t i = 0; i < g.size(); ++i)
    if (std::bit_cast<std::uint32_t>(g[i]) != std::bit_cast<std::uint32_t>(w[i]))
      return ::testing::AssertionFailure()
             << "element " << i << " of " << g.size() << ": " << g[i] << " vs " << w[i];
  return ::testing::AssertionSuccess();
}

void expect_same_bits(const std::vector<Leaf>& got, const std::vector<Leaf>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("leaf " + std::to_string(i) + " " + to_string(kShapes[i]));
    EXPECT_TRUE(same_bits(got[i].p, want[i].p)) << "p";
    EXPECT_TRUE(same_bits(got[i].m, want[i].m)) << "m";
    EXPECT_TRUE(same_bits(got[i].v, want[i].v)) << "v";
    EXPECT_TRUE(same_bits(got[i].g, want[i].g)) << "g";
  }
}

// Leaf i decays by decays[i % 2] (AdamW's masked and unmasked leaves).
double decay_of(std::size_t i, double lr, double wd) {
  return i % 2 == 0 ? 1.0 - lr * wd : 1.0;
}

// Three Adam steps per leaf and by the multi-leaf op, with the leaves on `devices`.
void check_adam(const std::vector<Device>& devices, AdamStep step) {
  const std::vector<Leaf> start = make_leaves(devices, 100);
  std::vector<Leaf> per_leaf = clone(start), many = clone(start);
  const double wd = 0.1;
  for (step.t = 1; step.t <= 3; ++step.t) {
    for (std::size_t i = 0; i < per_leaf.size(); ++i) {
      AdamStep s = step;
      s.decay = decay_of(i, step.lr, wd);
      adam_update_(per_leaf[i].p, per_leaf[i].g, per_leaf[i].m, per_leaf[i].v, s);
    }
    std::vector<UpdateLeaf> leaves;
    for (std::size_t i = 0; i < many.size(); ++i)
      leaves.push_back({&many[i].p, &many[i].g, &many[i].m, &many[i].v, decay_of(i, step.lr, wd)});
    adam_update_many_(leaves, step);
  }
  expect_same_bits(many, per_leaf);
  // And the update moved every non-empty parameter.
  for (std::size_t i = 0; i < many.size(); ++i)
    if (many[i].p.numel() > 0) {
      EXPECT_FALSE(same_bits(many[i].p, start[i].p)) << "leaf " << i << " did not move";
    }
}

// Three SGD steps per leaf and by the multi-leaf op (m the buffer when step.momentum > 0).
void check_sgd(const std::vector<Device>& devices, const SGDStep& step) {
  const std::vector<Leaf> start = make_leaves(devices, 200);
  std::vector<Leaf> per_leaf = clone(start), many = clone(start);
  const bool momentum = step.momentum > 0.f;
  for (int t = 0; t < 3; ++t) {
    Tensor none;
    for (Leaf& l : per_leaf)
      sgd_update_(l.p, l.g, momentum ? l.m : none, step);
    std::vector<UpdateLeaf> leaves;
    for (Leaf& l : many)
      leaves.push_back({&l.p, &l.g, momentum ? &l.m : nullptr, nullptr});
    sgd_update_many_(leaves, step);
  }
  expect_same_bits(many, per_leaf);
  for (std::size_t i = 0; i < many.size(); ++i)
    if (many[i].p.numel() > 0) {
      EXPECT_FALSE(same_bits(many[i].p, start[i].p)) << "leaf " << i << " did not move";
    }
}

// The current device (the checked one in the checked rerun).
std::vector<Device> one_device() {
  return {current_device()};
}
// Alternate leaves on the CPU and the checked device: one kernel call per device.
const std::vector<Device> kTwoDevices{Device::cpu(), Device{DeviceKind::Checked, 0}};

TEST(UpdateMany, AdamMatchesPerLeafBits) {
  check_adam(one_device(), {.lr = 1e-3, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8});
  check_adam(one_device(), {.lr = 3e-3, .b1 = 0.8, .b2 = 0.95, .eps = 1e-6, .l2 = 0.01});
}

TEST(UpdateMany, AdamOverTwoDevicesMatchesPerLeafBits) {
  check_adam(kTwoDevices, {.lr = 1e-3});
}

TEST(UpdateMany, SgdMatchesPerLeafBits) {
  check_sgd(one_device(), {.lr = 0.1f, .weight_decay = 0.01f});
  check_sgd(one_device(), {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f});
  check_sgd(one_device(), {.lr = 0.1f, .momentum = 0.9f, .nesterov = true});
  check_sgd(kTwoDevices, {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f});
}

// A parameter given twice (tied leaves) is updated twice, one update after the other, as
// two per-leaf calls would.
TEST(UpdateMany, TiedLeavesAreUpdatedInTurn) {
  std::vector<Leaf> per_leaf = make_leaves(one_device(), 300), many = clone(per_leaf);
  const SGDStep step{.lr = 0.1f, .momentum = 0.9f};
  sgd_update_(per_leaf[0].p, per_leaf[0].g, per_leaf[0].m, step);
  sgd_update_(per_leaf[0].p, per_leaf[0].g, per_leaf[0].v, step);
  const std::vector<UpdateLeaf> leaves{{&many[0].p, &many[0].g, &many[0].m, nullptr},
                                       {&many[0].p, &many[0].g, &many[0].v, nullptr}};
  sgd_update_many_(leaves, step);
  expect_same_bits({many[0]}, {per_leaf[0]});
}

// A bad leaf anywhere in the list throws before any leaf is updated.
TEST(UpdateMany, ChecksEveryLeafBeforeUpdatingAny) {
  std::vector<Leaf> leaves = make_leaves(one_device(), 400);
  const std::vector<Leaf> start = clone(leaves);
  Tensor wrong = Tensor::zeros({5});
  std::vector<UpdateLeaf> list;
  for (Leaf& l : leaves)
    list.push_back({&l.p, &l.g, &l.m, &l.v});
  list.back().grad = &wrong;
  EXPECT_THROW(adam_update_many_(list, {}), InvalidArgument);
  EXPECT_THROW(sgd_update_many_(list, {.lr = 0.1f}), InvalidArgument);
  expect_same_bits(leaves, start);
}

}  // namespace
}  // namespace distjax::tensor
