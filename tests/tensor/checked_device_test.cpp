// The checked device: tensors whose memory the host cannot touch except through the
// kernel table (and a HostAccess). Its factories, copies and reads work; a host access
// outside the table kills the process naming the last op; memory is counted per kind.
#include "distjax/distjax.hpp"
#include "distjax/tensor/host_access.hpp"

#include <gtest/gtest.h>

namespace distjax::tensor {
namespace {

const Device kChecked{DeviceKind::Checked, 0};

TEST(CheckedDevice, FactoriesCopiesAndReadsGoThroughTheTable) {
  DeviceScope on(kChecked);
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.device(), kChecked);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(Tensor::full({2}, 3.5).to_vector<float>(), (std::vector<float>{3.5f, 3.5f}));
  EXPECT_EQ(Tensor::zeros({3}, DType::I32).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{0, 0, 0}));
  EXPECT_EQ(Tensor::arange(3).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(Tensor::scalar(2.5).item<float>(), 2.5f);
  EXPECT_EQ(t.view_rows(1, 2).to_vector<float>(), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(t.clone().to_vector<float>(), t.to_vector<float>());
  EXPECT_NE(t.str().find("checked:0"), std::string::npos);
  EXPECT_NE(t.str().find("[1, 2, 3"), std::string::npos);
  EXPECT_EQ(astype(astype(t, DType::BF16), DType::F32).to_vector<float>(), t.to_vector<float>());

  Tensor host = t.to(Device::cpu());
  EXPECT_EQ(host.device(), Device::cpu());
  EXPECT_EQ(host.data<float>()[5], 6.f);
  EXPECT_TRUE(t.to(kChecked).shares_storage_with(t));  // already there: no copy
  const Device other{DeviceKind::Checked, 1};
  EXPECT_EQ(t.to(other).device(), other);
  EXPECT_EQ(t.to(other).to_vector<float>(), t.to_vector<float>());
}

TEST(CheckedDevice, MixedDevicesAreAnErrorNamingTheOpAndBothDevices) {
  Tensor a = Tensor::ones({2}, DType::F32, kChecked);
  Tensor b = Tensor::ones({2}, DType::F32, Device::cpu());
  try {
    (void)add(a, b);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[add]"), std::string::npos) << what;
    EXPECT_NE(what.find("checked:0"), std::string::npos) << what;
    EXPECT_NE(what.find("cpu"), std::string::npos) << what;
  }
}

TEST(CheckedDevice, MemoryIsCountedPerDeviceKind) {
  const std::int64_t cpu_before = live_bytes(DeviceKind::CPU);
  const std::int64_t checked_before = live_bytes(DeviceKind::Checked);
  {
    Tensor t = Tensor::empty({1024}, DType::F32, kChecked);
    EXPECT_EQ(live_bytes(DeviceKind::Checked) - checked_before, 4096);
    EXPECT_EQ(live_bytes(DeviceKind::CPU), cpu_before);
  }
  EXPECT_EQ(live_bytes(DeviceKind::Checked), checked_before);
}

// Storage allocates with its device kind's allocator: a CUDA device that does not exist
// (or a build without CUDA) is refused naming it.
TEST(CheckedDevice, StorageOnAMissingCudaDeviceIsRefusedNamingIt) {
  try {
    (void)Tensor::empty({2}, DType::F32, Device{DeviceKind::CUDA, 1000});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:1000"), std::string::npos) << e.what();
  }
}

TEST(CheckedDevice, HostAccessOpensItsMemoryForAScope) {
  Tensor t = Tensor::full({4}, 1.0, DType::F32, kChecked);
  {
    HostAccess access("test", t.device(), t.raw_data(), t.nbytes());
    t.data<float>()[2] = 7.f;
  }
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 1, 7, 1}));
  EXPECT_THROW(HostAccess("test", Device{DeviceKind::CUDA, 0}, nullptr, 4), NotImplemented);
}

TEST(CheckedDeviceDeathTest, AHostReadOutsideTheTableDiesNamingTheLastOp) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Tensor t = Tensor::full({4}, 1.0, DType::F32, kChecked);
        Tensor u = Tensor::full({4}, 2.0, DType::F32, kChecked);
        u = u.clone();
        volatile float v = t.data<float>()[0];
        (void)v;
      },
      "checked device.*outside the kernel table.*last op this thread dispatched was 'clone'");
}

TEST(CheckedDeviceDeathTest, AUseAfterFreeFaultsToo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        float* p = nullptr;
        {
          Tensor t = Tensor::full({4}, 1.0, DType::F32, kChecked);
          HostAccess access("test", t.device(), t.raw_data(), t.nbytes());
          p = t.data<float>();
        }
        volatile float v = p[0];
        (void)v;
      },
      "checked device");
}

}  // namespace
}  // namespace distjax::tensor
