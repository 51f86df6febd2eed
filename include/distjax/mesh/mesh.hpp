// Mesh: a grid of devices with named axes ("data", "model", "pipe", ...), 1-D to 4-D.
// Device ids run 0..N-1 in row-major order over the axes (the last axis varies fastest).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace distjax::mesh {

/// One or several mesh axis names, used wherever a collective or a context lookup
/// takes "an axis or a set of axes". Converts from a name, a braced list or a vector:
///
///   psum(ctx, x, "data");  psum(ctx, x, {"data", "model"});
struct Axes {
  std::vector<std::string> names;

  Axes() = default;
  Axes(const char* name) : names{name} {}                      // NOLINT: implicit
  Axes(std::string name) : names{std::move(name)} {}           // NOLINT: implicit
  Axes(std::string_view name) : names{std::string(name)} {}    // NOLINT: implicit
  Axes(std::initializer_list<std::string> ns) : names(ns) {}   // NOLINT: implicit
  Axes(std::vector<std::string> ns) : names(std::move(ns)) {}  // NOLINT: implicit

  bool empty() const { return names.empty(); }
  std::size_t size() const { return names.size(); }
  /// `"data"` or `("data", "model")`.
  std::string str() const;
  friend bool operator==(const Axes&, const Axes&) = default;
};

/// A logical grid of devices with named axes. Device `d` sits at the row-major
/// coordinates of `d` over `shape()`.
///
///   Mesh mesh({2, 4}, {"data", "model"});   // 8 devices
///   mesh.axis_size("model");                 // 4
///   mesh.coords(6);                          // {1, 2}
///   std::cout << mesh;                       // a 2x4 grid with axis names
class Mesh {
 public:
  /// Up to 4 axes with distinct, non-empty names and sizes >= 1; throws ShardingError.
  Mesh(std::vector<int> shape, std::vector<std::string> axis_names);
  /// A 1-D mesh of `n` devices along `axis`.
  static Mesh line(int n, std::string axis = "data") { return Mesh({n}, {std::move(axis)}); }

  /// Number of axes.
  int ndim() const { return static_cast<int>(shape_.size()); }
  /// Number of devices.
  int size() const { return size_; }
  const std::vector<int>& shape() const { return shape_; }
  const std::vector<std::string>& axis_names() const { return names_; }
  bool has_axis(std::string_view name) const;
  /// Position of `name` among the axes; throws ShardingError "[op] axis "x" is not in mesh (...)".
  int axis_position(std::string_view name, const char* op = "Mesh") const;
  /// Size of one axis; throws ShardingError for an unknown axis.
  int axis_size(std::string_view name, const char* op = "Mesh") const;
  /// Product of the sizes of `axes` (1 for none). Throws for unknown or repeated axes.
  int axes_size(const Axes& axes, const char* op = "Mesh") const;
  /// Checks that every name in `axes` is an axis of this mesh and none repeats.
  void check_axes(const Axes& axes, const char* op) const;

  /// Coordinates of device `device` (one per axis).
  std::vector<int> coords(int device) const;
  /// Device at `coords`.
  int device_at(const std::vector<int>& coords) const;
  /// Index of `device` within its group along `axes`: row-major over the coordinates
  /// of `axes` in the order given (JAX's axis_index over several axes).
  int index_along(int device, const Axes& axes) const;
  /// Index of the group of `device` along `axes`: row-major over the remaining axes.
  /// Devices that differ only along `axes` share it (the color of a split).
  int group_id(int device, const Axes& axes) const;
  /// The devices of `device`'s group along `axes`, ordered by index_along.
  std::vector<int> group(int device, const Axes& axes) const;

  /// `("data"=2, "model"=4)`, used in error messages.
  std::string describe() const;
  /// The device grid with axis names: rows are the first axis of the last two,
  /// columns the last; leading axes of 3-D/4-D meshes print one grid per slice.
  std::string to_string() const;

  friend bool operator==(const Mesh& a, const Mesh& b) {
    return a.shape_ == b.shape_ && a.names_ == b.names_;
  }

 private:
  std::vector<int> shape_;
  std::vector<std::string> names_;
  int size_ = 1;
};

std::ostream& operator<<(std::ostream& os, const Mesh& mesh);

}  // namespace distjax::mesh
