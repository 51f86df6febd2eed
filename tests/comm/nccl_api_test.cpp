// The NCCL seam: a build with NCCL reports the library's version (no GPU needed), a build
// without it says so.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "distjax/comm/nccl/nccl_api.hpp"
#include "distjax/tensor/cuda.hpp"

namespace {

using namespace distjax;

TEST(NcclApi, VersionIsReportedExactlyWhenBuiltWithNccl) {
  const std::string version = comm::detail::nccl_version();
  if (!comm::detail::built_with_nccl()) {
    EXPECT_EQ(version, "");
    return;
  }
  EXPECT_TRUE(tensor::built_with_cuda()) << "NCCL is built only together with CUDA";
  EXPECT_TRUE(std::regex_match(version, std::regex(R"(2\.[0-9]+\.[0-9]+)"))) << version;
}

}  // namespace
