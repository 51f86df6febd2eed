// What the docs' run test (the units doc_run_gen writes from the pages) gives the pages'
// `check:` and `run:` notes: the headers a block may use and a few helpers, in docs::.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distjax/distjax.hpp"

namespace distjax::docs {

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// Runs fn(ctx) on every device of `mesh` (shard_map with no inputs or outputs).
inline void on_each_device(const mesh::Mesh& mesh,
                           const std::function<void(spmd::DeviceContext&)>& fn) {
  spmd::shard_map(
      mesh,
      [&](spmd::DeviceContext& ctx, const std::vector<Tensor>&) {
        fn(ctx);
        return std::vector<Tensor>{};
      },
      {}, {})(std::vector<Tensor>{});
}

/// A value per device (up to 64), for a check inside a program to write (each device its
/// own) and the run note to read after it.
template <class T>
std::vector<T>& by_device() {
  static std::vector<T> values(64);
  return values;
}

/// The working directory for a scope: `dir` (a fresh empty one under the temporary
/// directory by default, removed after), so a block that writes "runs/x" or reads
/// "configs/..." finds what it expects.
class InDirectory {
 public:
  InDirectory() : InDirectory(fresh(), /*remove=*/true) {}
  explicit InDirectory(std::filesystem::path dir, bool remove = false)
      : dir_(std::move(dir)), back_(std::filesystem::current_path()), remove_(remove) {
    std::filesystem::current_path(dir_);
  }
  ~InDirectory() {
    std::filesystem::current_path(back_);
    if (remove_) std::filesystem::remove_all(dir_);
  }
  InDirectory(const InDirectory&) = delete;
  InDirectory& operator=(const InDirectory&) = delete;
  const std::filesystem::path& path() const { return dir_; }

 private:
  static std::filesystem::path fresh() {
    static int n = 0;
    const auto dir = std::filesystem::temp_directory_path() /
                     ("distjax_docs_run_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
  }
  std::filesystem::path dir_, back_;
  bool remove_;
};

/// A tensor of N(0, 1) values from `seed`.
inline Tensor random_normal(const Shape& shape, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape);
  distjax::random_normal(Key::from_seed(seed), t.data<float>(), t.numel());
  return t;
}

/// Expects every element of a and b within tol (and equal shapes).
inline void expect_near(const Tensor& a, const Tensor& b, double tol) {
  ASSERT_EQ(a.shape(), b.shape());
  const std::vector<float> va = tensor::astype(a, DType::F32).to_vector<float>(),
                           vb = tensor::astype(b, DType::F32).to_vector<float>();
  for (std::size_t i = 0; i < va.size(); ++i)
    EXPECT_NEAR(va[i], vb[i], tol) << "at " << i;
}

}  // namespace distjax::docs
