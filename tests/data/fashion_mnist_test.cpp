// IDX reading and Fashion-MNIST loading on small fixtures written by the test, plus one
// test on the real data set when the Debian package is installed.
#include "distjax/data/fashion_mnist.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "distjax/core/error.hpp"
#include "distjax/data/idx.hpp"

namespace distjax::data {
namespace {

namespace fs = std::filesystem;

class FixtureDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("distjax_fmnist_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // n images of 28x28 where pixel k of image i is (i * 7 + k) % 256; labels i % 10.
  void write_split(const std::string& prefix, std::int64_t n, std::int64_t n_labels = -1) {
    IdxArray images{{n, 28, 28}, {}};
    for (std::int64_t i = 0; i < n; ++i)
      for (int k = 0; k < 784; ++k)
        images.data.push_back(static_cast<std::uint8_t>((i * 7 + k) % 256));
    if (n_labels < 0) n_labels = n;
    IdxArray labels{{n_labels}, {}};
    for (std::int64_t i = 0; i < n_labels; ++i)
      labels.data.push_back(static_cast<std::uint8_t>(i % 10));
    write_idx((dir_ / (prefix + "-images-idx3-ubyte.gz")).string(), images);
    write_idx((dir_ / (prefix + "-labels-idx1-ubyte.gz")).string(), labels);
  }
  fs::path dir_;
};

TEST_F(FixtureDir, IdxRoundTripsGzippedAndPlain) {
  IdxArray a{{2, 3}, {1, 2, 3, 250, 251, 252}};
  for (bool gz : {true, false}) {
    const std::string path = (dir_ / (gz ? "a.gz" : "a.idx")).string();
    write_idx(path, a, gz);
    IdxArray b = read_idx(path);
    EXPECT_EQ(b.dims, a.dims);
    EXPECT_EQ(b.data, a.data);
  }
  // The gzipped file really is gzip (magic 1f 8b), the plain one starts with the IDX magic.
  std::ifstream gz(dir_ / "a.gz", std::ios::binary), plain(dir_ / "a.idx", std::ios::binary);
  EXPECT_EQ(gz.get(), 0x1f);
  EXPECT_EQ(plain.get(), 0x00);
}

TEST_F(FixtureDir, IdxErrorsNameTheFile) {
  EXPECT_THROW(read_idx((dir_ / "absent.gz").string()), IoError);
  {
    std::ofstream f(dir_ / "bad.idx", std::ios::binary);
    f << "PK\x03\x04 not idx";
  }
  EXPECT_THROW(read_idx((dir_ / "bad.idx").string()), IoError);
  // Truncated: header says 10 bytes, file has 3.
  {
    std::ofstream f(dir_ / "short.idx", std::ios::binary);
    const char bytes[] = {0, 0, 8, 1, 0, 0, 0, 10, 1, 2, 3};
    f.write(bytes, sizeof bytes);
  }
  try {
    read_idx((dir_ / "short.idx").string());
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("short.idx"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

TEST_F(FixtureDir, LoadsScaledImagesAndLabels) {
  write_split("train", 5);
  write_split("t10k", 3);
  EXPECT_TRUE(fashion_mnist_available(dir_.string()));
  ArrayDataset train = load_fashion_mnist(Split::Train, dir_.string());
  ArrayDataset test = load_fashion_mnist(Split::Test, dir_.string());
  EXPECT_EQ(train.inputs.shape(), (Shape{5, 784}));
  EXPECT_EQ(train.inputs.dtype(), DType::F32);
  EXPECT_EQ(train.labels.dtype(), DType::I32);
  EXPECT_EQ(test.size(), 3);
  const std::vector<float> x = train.inputs.to_vector<float>();
  EXPECT_FLOAT_EQ(x[0], 0.f);
  EXPECT_FLOAT_EQ(x[255], 1.f);
  EXPECT_FLOAT_EQ(x[2 * 784 + 1], 15.f / 255.f);
  EXPECT_EQ(train.labels.to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 1, 2, 3, 4}));
}

TEST_F(FixtureDir, MissingFilesNameTheDebianPackage) {
  EXPECT_FALSE(fashion_mnist_available(dir_.string()));
  try {
    load_fashion_mnist(Split::Train, dir_.string());
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("dataset-fashion-mnist"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train-images-idx3-ubyte.gz"), std::string::npos)
        << e.what();
  }
}

TEST_F(FixtureDir, MismatchedCountsAreAnError) {
  write_split("train", 4, 3);
  EXPECT_THROW(load_fashion_mnist(Split::Train, dir_.string()), IoError);
}

TEST(FashionMnist, RealDataSetIfInstalled) {
  if (!fashion_mnist_available()) {
    GTEST_SKIP() << "Fashion-MNIST is not installed in " << kFashionMnistDir
                 << " (Debian package dataset-fashion-mnist)";
  }
  ArrayDataset test = load_fashion_mnist(Split::Test);
  EXPECT_EQ(test.inputs.shape(), (Shape{10000, 784}));
  std::vector<int> per_class(10, 0);
  for (std::int32_t y : test.labels.to_vector<std::int32_t>())
    per_class.at(y)++;
  for (int c = 0; c < 10; ++c)
    EXPECT_EQ(per_class[c], 1000) << "class " << c;  // balanced set
  float lo = 1.f, hi = 0.f;
  double total = 0;
  const std::vector<float> x = test.inputs.to_vector<float>();
  for (std::int64_t i = 0; i < test.inputs.numel(); ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    total += x[i];
  }
  EXPECT_EQ(lo, 0.f);
  EXPECT_EQ(hi, 1.f);
  EXPECT_NEAR(total / test.inputs.numel(), 0.286, 0.01);  // Fashion-MNIST's known pixel mean
}

}  // namespace
}  // namespace distjax::data
