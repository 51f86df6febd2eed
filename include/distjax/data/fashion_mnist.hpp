// Fashion-MNIST (Xiao et al., 2017): 28x28 grey images of 10 kinds of clothing,
// 60,000 for training and 10,000 for testing, read from the gzipped IDX files that
// the Debian package `dataset-fashion-mnist` installs.
#pragma once

#include <array>
#include <string>

#include "distjax/data/array_dataset.hpp"

namespace distjax::data {

/// Where the Debian package `dataset-fashion-mnist` puts the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// The ten class names, in label order.
inline constexpr std::array<const char*, 10> kFashionMnistClasses = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

enum class Split { Train, Test };

/// Loads a split from `dir` ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
/// "t10k-..." for Test). inputs: (N, 784) f32 scaled to [0, 1]; labels: (N) i32 in [0, 10).
/// Throws IoError naming the missing file and the Debian package when a file is absent,
/// and IoError when images and labels disagree.
ArrayDataset load_fashion_mnist(Split split, const std::string& dir = kFashionMnistDir);

/// Whether all four files are present in `dir`.
bool fashion_mnist_available(const std::string& dir = kFashionMnistDir);

}  // namespace distjax::data
