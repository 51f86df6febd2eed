// In-place tensor functions on the CPU and on the checked device (where any host access
// outside the kernel table would kill the test): copies into views, strided runs, boxes,
// accumulation, scaling, GEMMs on sub-blocks and into views, and their argument errors.
#include "distjax/tensor/inplace_ops.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "distjax/core/error.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/matmul.hpp"
#include "distjax/tensor/shape_ops.hpp"
#include "test_tensors.hpp"

namespace distjax::tensor {
namespace {

std::vector<float> iota(std::int64_t n, float from = 0.f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

class InplaceOps : public ::testing::TestWithParam<Device> {
 protected:
  DeviceScope on_{GetParam()};
};

TEST_P(InplaceOps, CopyIntoAViewAndRowsBetweenBlocks) {
  Tensor bucket = Tensor::zeros({10});
  const Tensor g = Tensor::from_vector(iota(6, 1), {2, 3});
  ASSERT_EQ(g.device(), GetParam());
  copy_into(bucket.view_rows(3, 9), g);
  EXPECT_EQ(bucket.to_vector<float>(), (std::vector<float>{0, 0, 0, 1, 2, 3, 4, 5, 6, 0}));

  // A leaf of 5 elements in chunks of 2 into column 1 of 3 blocks of 4: rank-major packing.
  Tensor blocks = Tensor::zeros({12});
  const Tensor leaf = Tensor::from_vector(iota(5, 1), {5});
  copy_rows_into(blocks, {1, 4}, leaf, {0, 2}, 2, 2);
  copy_rows_into(blocks, {2 * 4 + 1, 0}, leaf, {4, 0}, 1, 1);
  EXPECT_EQ(blocks.to_vector<float>(), (std::vector<float>{0, 1, 2, 0, 0, 3, 4, 0, 0, 5, 0, 0}));
  Tensor back = Tensor::zeros({5});
  copy_rows_into(back, {0, 2}, blocks, {1, 4}, 2, 2);
  copy_rows_into(back, {4, 0}, blocks, {9, 0}, 1, 1);
  EXPECT_EQ(back.to_vector<float>(), leaf.to_vector<float>());
}

TEST_P(InplaceOps, BoxesOfAnArray) {
  const Tensor global = Tensor::from_vector(iota(24), {2, 3, 4});
  Tensor local = Tensor::empty({1, 2, 2});
  copy_from_box(local, global, {1, 1, 2});
  EXPECT_EQ(local.to_vector<float>(), (std::vector<float>{18, 19, 22, 23}));
  Tensor out = Tensor::zeros({2, 3, 4});
  copy_to_box(out, {0, 0, 1}, local);
  std::vector<float> want(24, 0.f);
  want[1] = 18, want[2] = 19, want[5] = 22, want[6] = 23;
  EXPECT_EQ(out.to_vector<float>(), want);
  Tensor scalar = Tensor::empty({});
  copy_from_box(scalar, Tensor::scalar(7.0), {});
  EXPECT_EQ(scalar.item<float>(), 7.f);
}

TEST_P(InplaceOps, AddIntoAccumulates) {
  Tensor acc = Tensor::from_vector(iota(5), {5});
  add_into(acc, Tensor::from_vector(iota(5, 10), {5}));
  EXPECT_EQ(acc.to_vector<float>(), (std::vector<float>{10, 12, 14, 16, 18}));
}

TEST_P(InplaceOps, GemmIntoSubBlocksMatchesMatmulOfTheSlices) {
  // kernel (4, 6); columns [2, 5) in place; then rows [1, 3) accumulated with beta = 1.
  const Tensor x = Tensor::from_vector(iota(8, -3), {2, 4});
  const Tensor kernel = Tensor::from_vector(iota(24, -10), {4, 6});
  const std::vector<float> k = kernel.to_vector<float>();
  std::vector<float> cols, rows;
  for (int r = 0; r < 4; ++r)
    for (int c = 2; c < 5; ++c)
      cols.push_back(k[r * 6 + c]);
  for (int r = 1; r < 3; ++r)
    for (int c = 0; c < 6; ++c)
      rows.push_back(k[r * 6 + c]);
  // The references: matmul of copies of the slices, on the CPU.
  const Device cpu = Device::cpu();
  auto reference = [&](const std::vector<float>& a, const Shape& sa, const std::vector<float>& b,
                       const Shape& sb) {
    DeviceScope on_cpu(cpu);
    return matmul(Tensor::from_vector(a, sa), Tensor::from_vector(b, sb)).to_vector<float>();
  };
  Tensor y = Tensor::empty({2, 3});
  gemm_into(y, {0, 3}, x, {0, 4}, false, kernel, {2, 6}, false, 2, 3, 4);
  EXPECT_EQ(y.to_vector<float>(), reference(x.to_vector<float>(), {2, 4}, cols, {4, 3}));
  // C (2, 6) += x[:, 0:2] @ kernel[1:3, :]: a's block is the first 2 of each row of 4.
  Tensor c = Tensor::ones({2, 6});
  gemm_into(c, {0, 6}, x, {0, 4}, false, kernel, {6, 6}, false, 2, 6, 2, 1.f, 1.f);
  const std::vector<float> xs = x.to_vector<float>();
  std::vector<float> want = reference({xs[0], xs[1], xs[4], xs[5]}, {2, 2}, rows, {2, 6});
  for (float& v : want)
    v += 1.f;
  EXPECT_EQ(c.to_vector<float>(), want);
}

// x *= s in x's dtype: the bits of mul(x, s) for f32, and of its widening, product and
// rounding for bf16 and f16.
TEST_P(InplaceOps, ScaleIntoMultipliesInTheTensorsOwnDtype) {
  const Tensor x = testing::randn({3, 37}, 5);
  const Tensor s = Tensor::scalar(0.3);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor t = astype(x, dtype);
    const Tensor want = astype(mul(astype(t, DType::F32), s), dtype);
    scale_into(t, s);
    EXPECT_EQ(astype(t, DType::F32).to_vector<float>(),
              astype(want, DType::F32).to_vector<float>());
  }
}

// Products written into a block of rows (f32 or the operands' dtype) and accumulated into
// an f32 C: the bits of matmul, of its rounding and of add(C, matmul).
TEST_P(InplaceOps, MatmulIntoWritesAndAccumulatesTheProductsBits) {
  const Tensor a = testing::randn({6, 5}, 1), b = testing::randn({5, 7}, 2);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor a16 = astype(a, dtype), b16 = astype(b, dtype);
    // Rows [2, 5) of a (10, 7) C, in f32 and in the operands' dtype; b read transposed.
    const Tensor bt = astype(transpose(b, 0, 1), dtype);
    for (DType out : {DType::F32, dtype}) {
      const Tensor c = Tensor::zeros({10, 7}, out);
      matmul_into(c.view_rows(2, 5), a16.view_rows(0, 3), bt, false, true);
      const Tensor want = astype(matmul(a16.view_rows(0, 3), b16), out);
      EXPECT_EQ(astype(c.view_rows(2, 5), DType::F32).to_vector<float>(),
                astype(want, DType::F32).to_vector<float>());
      EXPECT_EQ(astype(c.view_rows(0, 2), DType::F32).to_vector<float>(),
                std::vector<float>(14, 0.f));
    }
    // C (5, 7) += a^T-stored product, twice.
    const Tensor at = astype(transpose(a, 0, 1), dtype);  // (5, 6)
    const Tensor c = testing::randn({6, 7}, 3);
    const Tensor c0 = Tensor::from_vector(c.to_vector<float>(), c.shape());
    matmul_into(c, at, b16, true, false, /*accumulate=*/true);
    const Tensor once = add(c0, matmul(a16, b16));
    EXPECT_EQ(c.to_vector<float>(), once.to_vector<float>());
    matmul_into(c, at, b16, true, false, /*accumulate=*/true);
    EXPECT_EQ(c.to_vector<float>(), add(once, matmul(a16, b16)).to_vector<float>());
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, InplaceOps,
                         ::testing::Values(Device::cpu(), Device{DeviceKind::Checked, 0}),
                         [](const auto& info) {
                           return std::string(device_kind_name(info.param.kind));
                         });

template <class F>
void expect_invalid(F f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error, expected " << part;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << e.what() << "\n  expected: " << part;
  }
}

TEST(InplaceOpsErrors, NameTheOpAndWhatIsWrong) {
  DeviceScope on_cpu(Device::cpu());  // the last one mixes in a checked tensor
  const Tensor a = Tensor::zeros({4}), b = Tensor::zeros({5});
  expect_invalid([&] { copy_into(a, b); }, "[copy_into] dst (4,) and src (5,)");
  expect_invalid([&] { copy_into(a, Tensor::zeros({4}, DType::I32)); },
                 "[copy_into] dst is f32 but src is i32");
  expect_invalid(
      [&] {
        copy_rows_into(a, {0, 2}, b, {0, 2}, 3, 2);
      },
      "do not fit dst of 4 elements");
  expect_invalid([&] { add_into(a, a.view_rows(0, 4)); }, "[add_into] dst and src overlap");
  expect_invalid(
      [&] {
        copy_from_box(Tensor::zeros({2, 2}), Tensor::zeros({3, 3}), {2, 0});
      },
      "leaves the array (3, 3)");
  expect_invalid(
      [&] {
        gemm_into(a, {0, 2}, a, {0, 2}, false, b, {0, 2}, false, 2, 2, 3);
      },
      "[gemm_into]");
  expect_invalid([&] { scale_into(a, b); }, "[scale_into] the scale is one value, got (5,)");
  expect_invalid([&] { scale_into(Tensor::zeros({2}, DType::I32), Tensor::scalar(2.0)); },
                 "[scale_into] scales f32, bf16 or f16, not i32");
  const Tensor m = Tensor::zeros({2, 3}), m16 = Tensor::zeros({2, 3}, DType::BF16);
  expect_invalid(
      [&] {
        matmul_into(Tensor::zeros({2, 2}), m, m, false, false);
      },
      "[matmul_into] c (2, 2) is not a (2, 3) @ (2, 3) product");
  expect_invalid(
      [&] {
        matmul_into(Tensor::zeros({2, 2}, DType::BF16), m16, m16, false, true, true);
      },
      "[matmul_into] writes f32 when it accumulates, not bf16");
  expect_invalid([&] { matmul_into(m, m16, m, false, false); },
                 "[matmul_into] operands must both be f32, both bf16 or both f16");
  expect_invalid(
      [&] {
        matmul_into(m.view({3, 2}), m, Tensor::zeros({2, 2}), true, false);
      },
      "[matmul_into] c shares memory with an operand");
  expect_invalid(
      [&] {
        copy_into(a, Tensor::zeros({4}, DType::F32, Device{DeviceKind::Checked, 0}));
      },
      "[copy_into] expects its tensors on one device, got checked:0 and cpu");
}

}  // namespace
}  // namespace distjax::tensor
