#include "distjax/data/fashion_mnist.hpp"

#include <filesystem>

#include "distjax/core/error.hpp"
#include "distjax/data/detail/on_device.hpp"
#include "distjax/data/idx.hpp"

namespace distjax::data {

namespace {

struct Files {
  std::string images, labels;
};

Files files_of(Split split, const std::string& dir) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  return {dir + "/" + prefix + "-images-idx3-ubyte.gz",
          dir + "/" + prefix + "-labels-idx1-ubyte.gz"};
}

void require(const std::string& path) {
  DISTJAX_CHECK(std::filesystem::exists(path), IoError, "[load_fashion_mnist] \"", path,
                "\" not found; install the Debian package `dataset-fashion-mnist` "
                "(apt-get install dataset-fashion-mnist) or pass the directory holding the "
                "four gzipped IDX files");
}

}  // namespace

bool fashion_mnist_available(const std::string& dir) {
  for (Split s : {Split::Train, Split::Test}) {
    Files f = files_of(s, dir);
    if (!std::filesystem::exists(f.images) || !std::filesystem::exists(f.labels)) return false;
  }
  return true;
}

ArrayDataset load_fashion_mnist(Split split, const std::string& dir) {
  const Files f = files_of(split, dir);
  require(f.images);
  require(f.labels);
  const IdxArray images = read_idx(f.images);
  const IdxArray labels = read_idx(f.labels);
  DISTJAX_CHECK(images.dims.size() == 3 && labels.dims.size() == 1, IoError,
                "[load_fashion_mnist] expected images (N, rows, cols) and labels (N), got ranks ",
                images.dims.size(), " and ", labels.dims.size());
  const std::int64_t n = images.dims[0];
  DISTJAX_CHECK(labels.dims[0] == n, IoError, "[load_fashion_mnist] ", n, " images but ",
                labels.dims[0], " labels in ", dir);
  const std::int64_t features = images.dims[1] * images.dims[2];
  // Decoded on the host, then handed to the current device with one copy each.
  ArrayDataset out;
  out.inputs = Tensor::empty({n, features}, DType::F32, Device::cpu());
  out.labels = Tensor::empty({n}, DType::I32, Device::cpu());
  float* x = out.inputs.data<float>();
  const std::int64_t total = n * features;
  for (std::int64_t i = 0; i < total; ++i)
    x[i] = static_cast<float>(images.data[i]) * (1.f / 255.f);
  std::int32_t* y = out.labels.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    DISTJAX_CHECK(labels.data[i] < 10, IoError, "[load_fashion_mnist] label ", int(labels.data[i]),
                  " at index ", i, " of \"", f.labels, "\" is outside [0, 10)");
    y[i] = labels.data[i];
  }
  return on_current_device(std::move(out));
}

}  // namespace distjax::data
