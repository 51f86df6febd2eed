// ShardedArray: device_put / gather round trips on every test mesh and shard contents.
#include "distjax/mesh/sharded_array.hpp"

#include <gtest/gtest.h>

#include "distjax/core/error.hpp"

using namespace distjax;
using namespace distjax::mesh;

namespace {

Tensor iota(const Shape& s) {
  std::vector<float> v(static_cast<std::size_t>(numel(s)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(i);
  return Tensor::from_vector(v, s);
}

struct Case {
  Mesh mesh;
  PartitionSpec spec;
  Shape shape;
};

}  // namespace

TEST(ShardedArray, RoundTripsOnEveryTestMesh) {
  std::vector<Case> cases = {
      {Mesh::line(1), P("data"), {3, 2}},
      {Mesh::line(2), P("data"), {4, 3}},
      {Mesh::line(4), P(std::nullopt, "data"), {3, 8}},
      {Mesh::line(8), P("data"), {16}},
      {Mesh({2, 4}, {"data", "model"}), P("data", "model"), {4, 8}},
      {Mesh({2, 4}, {"data", "model"}), P("model", std::nullopt, "data"), {4, 3, 2}},
      {Mesh({4, 2}, {"data", "model"}), P({"data", "model"}), {16, 2}},
      {Mesh({4, 2}, {"data", "model"}), P({"model", "data"}), {8, 3}},
      {Mesh({2, 2, 2}, {"pipe", "data", "model"}), P("pipe", {"data", "model"}), {2, 8}},
      {Mesh({2, 2, 2}, {"pipe", "data", "model"}), P(), {5, 3}},
      {Mesh({3, 2}, {"data", "model"}), P("data", "model"), {6, 4}},
      {Mesh({3, 2}, {"data", "model"}), P(std::nullopt, "data"), {2, 9}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.mesh.describe() + " " + c.spec.to_string());
    Tensor host = iota(c.shape);
    ShardedArray a = device_put(host, NamedSharding(c.mesh, c.spec));
    EXPECT_EQ(a.num_devices(), c.mesh.size());
    EXPECT_EQ(a.shape(), c.shape);
    Tensor back = gather(a);
    EXPECT_EQ(back.shape(), host.shape());
    EXPECT_EQ(back.to_vector<float>(), host.to_vector<float>());
    // Each shard is its own copy.
    for (int d = 1; d < a.num_devices(); ++d)
      EXPECT_FALSE(a.shard(d).shares_storage_with(a.shard(0)));
  }
}

TEST(ShardedArray, ShardContents) {
  Mesh m({2, 4}, {"data", "model"});
  Tensor host = iota({4, 8});  // value = 8 * row + col
  ShardedArray a = device_put(host, NamedSharding(m, P("data", "model")));
  // Device 6 = (data 1, model 2): rows 2..4, columns 4..6.
  EXPECT_EQ(a.shard(6).shape(), (Shape{2, 2}));
  EXPECT_EQ(a.shard(6).to_vector<float>(), (std::vector<float>{20, 21, 28, 29}));
  // Replicated along "model": devices 4..7 hold the same rows.
  ShardedArray r = device_put(host, NamedSharding(m, P("data")));
  for (int d = 4; d < 8; ++d)
    EXPECT_EQ(r.shard(d).to_vector<float>(), r.shard(4).to_vector<float>());
  EXPECT_EQ(r.shard(5).to_vector<float>()[0], 16.f);
  // Integer dtypes work too.
  Tensor ih = Tensor::from_vector<std::int32_t>({1, 2, 3, 4, 5, 6, 7, 8}, {8});
  ShardedArray ia = device_put(ih, NamedSharding(m, P({"data", "model"})));
  EXPECT_EQ(ia.shard(3).to_vector<std::int32_t>(), (std::vector<std::int32_t>{4}));
  EXPECT_EQ(gather(ia).to_vector<std::int32_t>(), ih.to_vector<std::int32_t>());
}

TEST(ShardedArray, DevicePutNamesTheArgument) {
  Mesh m({4, 2}, {"data", "model"});
  try {
    device_put(iota({6, 4}), NamedSharding(m, P("data", "model")), "x");
    FAIL() << "expected ShardingError";
  } catch (const ShardingError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "[device_put] argument \"x\" with shape (6, 4): spec P(\"data\", \"model\") is "
                  "invalid on mesh (\"data\"=4, \"model\"=2): dimension 0 (6) is not divisible by "
                  "\"data\"=4"),
              std::string::npos)
        << e.what();
  }
}

TEST(ShardedArray, RejectsWrongShardShapes) {
  Mesh m = Mesh::line(2);
  NamedSharding s(m, P("data"));
  EXPECT_THROW(ShardedArray({4}, DType::F32, s, {Tensor::zeros({2}), Tensor::zeros({3})}),
               ShardingError);
  EXPECT_THROW(ShardedArray({4}, DType::F32, s, {Tensor::zeros({2})}), ShardingError);
  // Missing shards are allowed (other processes hold them) but gather says so.
  ShardedArray partial({4}, DType::F32, s, {Tensor::zeros({2}), Tensor()});
  EXPECT_FALSE(partial.has_shard(1));
  EXPECT_THROW(gather(partial), ShardingError);
}
