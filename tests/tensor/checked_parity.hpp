// Runs an op forward and backward on the CPU and on the checked device from the same
// inputs and requires the same bits: the checked device's memory opens only for the
// kernel table's kernels, so a host access an op makes outside the table kills the test
// (naming the op), and any difference between the two paths shows as a mismatch.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/core/prng.hpp"
#include "distjax/tensor/grad_node.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::testing {

using tensor::Tensor;

/// Values in [-1, 1) from a fixed key, on the CPU.
inline Tensor host_uniform(const Shape& shape, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(numel(shape)));
  random_uniform(Key::from_seed(seed), v.data(), numel(shape), -1.f, 1.f);
  return Tensor::from_vector(v, shape, Device::cpu());
}

/// y = fn(inputs) and the gradients of sum(y * ct) with respect to the inputs marked in
/// `diff`, all copied to the CPU; the inputs (CPU tensors) are moved to `device` first, and
/// `device` is the current device while fn runs.
inline std::vector<Tensor> run_on(Device device,
                                  const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                  const std::vector<Tensor>& inputs, const std::vector<bool>& diff,
                                  const Tensor& ct) {
  DeviceScope scope(device);
  std::vector<Tensor> args, leaves;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Tensor t = inputs[i].to(device);
    if (diff[i]) {
      t = tensor::make_leaf(t);
      leaves.push_back(t);
    }
    args.push_back(t);
  }
  const Tensor y = fn(args);
  EXPECT_EQ(y.device(), device);
  std::vector<Tensor> out{y.to(Device::cpu())};
  if (leaves.empty()) return out;
  for (const Tensor& g : autodiff::grad({y}, {ct.to(device)}, leaves)) {
    EXPECT_EQ(g.device(), device);
    out.push_back(g.to(Device::cpu()));
  }
  return out;
}

/// Whether two CPU tensors hold the same shape, dtype and bytes.
inline ::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << a.str(0) << " vs " << b.str(0);
  if (a.nbytes() > 0 && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0)
    return ::testing::AssertionFailure() << "the bytes differ: " << a.str() << " vs " << b.str();
  return ::testing::AssertionSuccess();
}

/// fn on the checked device gives the CPU's bits, forward and backward (see the file
/// comment). `inputs` are CPU tensors; those marked in `diff` are differentiated.
inline void expect_same_on_checked(const std::string& what,
                                   const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<bool>& diff) {
  SCOPED_TRACE(what);
  Tensor ct;
  {
    DeviceScope cpu(Device::cpu());
    tensor::NoGradGuard off;
    ct = host_uniform(fn(inputs).shape(), 7);
  }
  const std::vector<Tensor> want = run_on(Device::cpu(), fn, inputs, diff, ct);
  const std::vector<Tensor> got = run_on(Device{DeviceKind::Checked, 0}, fn, inputs, diff, ct);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(same_bits(got[i], want[i])) << (i == 0 ? "output" : "gradient ") << (i ? i - 1 : 0);
}

}  // namespace distjax::testing
