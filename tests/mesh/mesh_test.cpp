// Mesh, PartitionSpec and NamedSharding: coordinates, groups, printing, spec validation.
#include "distjax/mesh/mesh.hpp"

#include <gtest/gtest.h>

#include "distjax/core/error.hpp"
#include "distjax/mesh/named_sharding.hpp"
#include "distjax/mesh/partition_spec.hpp"

using namespace distjax;
using namespace distjax::mesh;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ShardingError& e) {
    return e.what();
  }
  return "<no ShardingError>";
}

}  // namespace

TEST(Mesh, CoordinatesAreRowMajor) {
  Mesh m({2, 4}, {"data", "model"});
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(m.ndim(), 2);
  EXPECT_EQ(m.axis_size("model"), 4);
  EXPECT_EQ(m.coords(6), (std::vector<int>{1, 2}));
  for (int d = 0; d < 8; ++d)
    EXPECT_EQ(m.device_at(m.coords(d)), d);
  Mesh m3({2, 2, 2}, {"pipe", "data", "model"});
  EXPECT_EQ(m3.coords(5), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(m3.axes_size({"pipe", "model"}), 4);
}

TEST(Mesh, GroupsAlongAxes) {
  Mesh m({2, 4}, {"data", "model"});
  EXPECT_EQ(m.group(6, "model"), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.group(6, "data"), (std::vector<int>{2, 6}));
  EXPECT_EQ(m.group(6, {"data", "model"}), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Order of a set of axes is major-to-minor as given.
  EXPECT_EQ(m.group(0, {"model", "data"}), (std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(m.index_along(6, "model"), 2);
  EXPECT_EQ(m.index_along(6, "data"), 1);
  EXPECT_EQ(m.index_along(6, {"data", "model"}), 6);
  EXPECT_EQ(m.index_along(6, {"model", "data"}), 5);
  EXPECT_EQ(m.group_id(6, "model"), 1);
  EXPECT_EQ(m.group_id(6, "data"), 2);
  EXPECT_EQ(m.group_id(6, {"data", "model"}), 0);
  Mesh m32({3, 2}, {"data", "model"});
  EXPECT_EQ(m32.group(3, "data"), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(m32.index_along(3, "data"), 1);
}

TEST(Mesh, InvalidMeshesAndAxes) {
  EXPECT_THROW(Mesh({2, 2}, {"data", "data"}), ShardingError);
  EXPECT_THROW(Mesh({2}, {"data", "model"}), ShardingError);
  EXPECT_THROW(Mesh({0}, {"data"}), ShardingError);
  EXPECT_THROW(Mesh({1, 1, 1, 1, 1}, {"a", "b", "c", "d", "e"}), ShardingError);
  Mesh m({2, 4}, {"data", "model"});
  const std::string msg = error_of([&] { m.axis_size("pipe", "all_gather"); });
  EXPECT_NE(msg.find("[all_gather] axis \"pipe\" is not in mesh (\"data\"=2, \"model\"=4)"),
            std::string::npos)
      << msg;
  EXPECT_THROW(m.axes_size({"data", "data"}), ShardingError);
}

TEST(Mesh, PrintsAGridWithAxisNames) {
  Mesh m({2, 4}, {"data", "model"});
  const std::string s = m.to_string();
  EXPECT_NE(s.find("Mesh (\"data\"=2, \"model\"=4), 8 devices"), std::string::npos) << s;
  EXPECT_NE(s.find("model (4) →"), std::string::npos) << s;
  EXPECT_NE(s.find("data (2) ↓ │ 0 │ 1 │ 2 │ 3 │"), std::string::npos) << s;
  EXPECT_NE(s.find("│ 4 │ 5 │ 6 │ 7 │"), std::string::npos) << s;
  // A 3-D mesh prints one grid per slice of its leading axis.
  Mesh m3({2, 2, 2}, {"pipe", "data", "model"});
  const std::string s3 = m3.to_string();
  EXPECT_NE(s3.find("[pipe=0]"), std::string::npos) << s3;
  EXPECT_NE(s3.find("[pipe=1]"), std::string::npos) << s3;
  EXPECT_NE(s3.find("│ 6 │ 7 │"), std::string::npos) << s3;
  // 1-D: one row.
  EXPECT_NE(Mesh::line(8).to_string().find("│ 0 │ 1 │ 2 │ 3 │ 4 │ 5 │ 6 │ 7 │"), std::string::npos);
}

TEST(PartitionSpec, Spellings) {
  EXPECT_EQ(P().size(), 0);
  EXPECT_EQ(P("data").size(), 1);
  EXPECT_EQ(P("data", "model").size(), 2);
  EXPECT_EQ(P({"data", "model"}).size(), 1);
  EXPECT_EQ(P({"data", "model"}).entries()[0].axes, (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(P("data", std::nullopt).to_string(), "P(\"data\", None)");
  EXPECT_EQ(P(std::nullopt, {"data", "model"}).to_string(), "P(None, (\"data\", \"model\"))");
  EXPECT_TRUE(P("data", std::nullopt).entry(1).replicated());
  EXPECT_TRUE(P("data").entry(5).replicated());
  EXPECT_TRUE(P("data", "model").uses("model"));
  EXPECT_FALSE(P("data").uses("model"));
}

TEST(NamedSharding, ShardShapesAndRanges) {
  Mesh m({2, 4}, {"data", "model"});
  NamedSharding s(m, P("data", "model"));
  EXPECT_EQ(s.shard_shape({8, 16}), (Shape{4, 4}));
  EXPECT_EQ(s.global_shape({4, 4}), (Shape{8, 16}));
  auto r = s.shard_range({8, 16}, 6);  // coords (1, 2)
  EXPECT_EQ(r[0], (std::pair<std::int64_t, std::int64_t>{4, 8}));
  EXPECT_EQ(r[1], (std::pair<std::int64_t, std::int64_t>{8, 12}));
  NamedSharding s2(m, P({"data", "model"}));
  EXPECT_EQ(s2.shard_shape({16, 3}), (Shape{2, 3}));
  EXPECT_EQ(s2.shard_range({16, 3}, 5)[0].first, 10);
  EXPECT_EQ(NamedSharding(m, P(std::nullopt, "data")).replicated_axes(),
            (std::vector<std::string>{"model"}));
}

TEST(NamedSharding, ValidationMessagesNameArgumentShapeSpecAndMesh) {
  Mesh m({4, 2}, {"data", "model"});
  std::string msg = error_of([&] {
    validate_spec(m, P("data", "model"), {6, 4}, "device_put", "x");
  });
  EXPECT_NE(msg.find("[device_put] argument \"x\" with shape (6, 4): spec P(\"data\", \"model\")"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("dimension 0 (6) is not divisible by \"data\"=4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mesh (\"data\"=4, \"model\"=2)"), std::string::npos) << msg;

  msg = error_of([&] { validate_spec(m, P("pipe"), {8}, "device_put", "w"); });
  EXPECT_NE(msg.find("argument \"w\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("axis \"pipe\" (dimension 0) is not in the mesh"), std::string::npos) << msg;

  msg = error_of([&] { validate_spec(m, P("data", "data"), {8, 8}, "device_put", "x"); });
  EXPECT_NE(msg.find("axis \"data\" is used twice"), std::string::npos) << msg;

  msg = error_of([&] {
    validate_spec(m, P("data", std::nullopt, "model"), {8, 8}, "shard_map", "y");
  });
  EXPECT_NE(msg.find("[shard_map] argument \"y\" with shape (8, 8)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("it has 3 entries but the array has rank 2"), std::string::npos) << msg;

  msg = error_of([&] { validate_spec(m, P({"data", "model"}), {12}, "device_put", "b"); });
  EXPECT_NE(msg.find("not divisible by (\"data\"=4 x \"model\"=2 = 8)"), std::string::npos) << msg;

  EXPECT_NO_THROW(validate_spec(m, P({"data", "model"}), {16}, "device_put", "b"));
  EXPECT_THROW(NamedSharding(m, P("nope")), ShardingError);
}
