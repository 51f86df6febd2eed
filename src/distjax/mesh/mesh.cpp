// Mesh: axis bookkeeping, coordinates, groups along axes, and grid printing.
#include "distjax/mesh/mesh.hpp"

#include <algorithm>
#include <limits>
#include <sstream>

#include "distjax/core/error.hpp"

namespace distjax::mesh {

std::string Axes::str() const {
  if (names.size() == 1) return "\"" + names[0] + "\"";
  std::string s = "(";
  for (std::size_t i = 0; i < names.size(); ++i)
    s += (i ? ", \"" : "\"") + names[i] + "\"";
  return s + ")";
}

Mesh::Mesh(std::vector<int> shape, std::vector<std::string> axis_names)
    : shape_(std::move(shape)), names_(std::move(axis_names)) {
  DISTJAX_CHECK(!shape_.empty() && shape_.size() <= 4, ShardingError,
                "[Mesh] a mesh has 1 to 4 axes, got ", shape_.size());
  DISTJAX_CHECK(shape_.size() == names_.size(), ShardingError, "[Mesh] ", shape_.size(),
                " axis sizes but ", names_.size(), " axis names");
  for (std::size_t i = 0; i < shape_.size(); ++i) {
    DISTJAX_CHECK(shape_[i] >= 1, ShardingError, "[Mesh] axis \"", names_[i], "\" has size ",
                  shape_[i], "; sizes must be >= 1");
    DISTJAX_CHECK(!names_[i].empty(), ShardingError, "[Mesh] axis ", i, " has an empty name");
    for (std::size_t j = 0; j < i; ++j)
      DISTJAX_CHECK(names_[i] != names_[j], ShardingError, "[Mesh] axis name \"", names_[i],
                    "\" is used twice");
    DISTJAX_CHECK(shape_[i] <= std::numeric_limits<int>::max() / size_, ShardingError,
                  "[Mesh] axis \"", names_[i], "\" of size ", shape_[i], " makes more than ",
                  std::numeric_limits<int>::max(), " devices");
    size_ *= shape_[i];
  }
}

bool Mesh::has_axis(std::string_view name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

int Mesh::axis_position(std::string_view name, const char* op) const {
  auto it = std::find(names_.begin(), names_.end(), name);
  DISTJAX_CHECK(it != names_.end(), ShardingError, "[", op, "] axis \"", name, "\" is not in mesh ",
                describe());
  return static_cast<int>(it - names_.begin());
}

int Mesh::axis_size(std::string_view name, const char* op) const {
  return shape_[axis_position(name, op)];
}

void Mesh::check_axes(const Axes& axes, const char* op) const {
  for (std::size_t i = 0; i < axes.names.size(); ++i) {
    axis_position(axes.names[i], op);
    for (std::size_t j = 0; j < i; ++j)
      DISTJAX_CHECK(axes.names[i] != axes.names[j], ShardingError, "[", op, "] axis \"",
                    axes.names[i], "\" appears twice in ", axes.str());
  }
}

int Mesh::axes_size(const Axes& axes, const char* op) const {
  check_axes(axes, op);
  int n = 1;
  for (const auto& a : axes.names)
    n *= axis_size(a, op);
  return n;
}

std::vector<int> Mesh::coords(int device) const {
  DISTJAX_CHECK(device >= 0 && device < size_, ShardingError, "[Mesh] device ", device,
                " is not in mesh ", describe(), " of ", size_, " devices");
  std::vector<int> c(shape_.size());
  for (int i = ndim() - 1; i >= 0; --i) {
    c[i] = device % shape_[i];
    device /= shape_[i];
  }
  return c;
}

int Mesh::device_at(const std::vector<int>& coords) const {
  DISTJAX_CHECK(coords.size() == shape_.size(), ShardingError, "[Mesh] ", coords.size(),
                " coordinates for mesh ", describe());
  int d = 0;
  for (int i = 0; i < ndim(); ++i) {
    DISTJAX_CHECK(coords[i] >= 0 && coords[i] < shape_[i], ShardingError, "[Mesh] coordinate ",
                  coords[i], " out of range for axis \"", names_[i], "\"=", shape_[i]);
    d = d * shape_[i] + coords[i];
  }
  return d;
}

int Mesh::index_along(int device, const Axes& axes) const {
  check_axes(axes, "Mesh::index_along");
  const std::vector<int> c = coords(device);
  int idx = 0;
  for (const auto& a : axes.names) {
    const int p = axis_position(a);
    idx = idx * shape_[p] + c[p];
  }
  return idx;
}

int Mesh::group_id(int device, const Axes& axes) const {
  check_axes(axes, "Mesh::group_id");
  const std::vector<int> c = coords(device);
  int id = 0;
  for (int i = 0; i < ndim(); ++i) {
    if (std::find(axes.names.begin(), axes.names.end(), names_[i]) != axes.names.end()) continue;
    id = id * shape_[i] + c[i];
  }
  return id;
}

std::vector<int> Mesh::group(int device, const Axes& axes) const {
  const int n = axes_size(axes, "Mesh::group");
  std::vector<int> members(n);
  const std::vector<int> base = coords(device);
  for (int k = 0; k < n; ++k) {
    std::vector<int> c = base;
    int rem = k;
    for (int j = static_cast<int>(axes.names.size()) - 1; j >= 0; --j) {
      const int p = axis_position(axes.names[j]);
      c[p] = rem % shape_[p];
      rem /= shape_[p];
    }
    members[k] = device_at(c);
  }
  return members;
}

std::string Mesh::describe() const {
  std::string s = "(";
  for (int i = 0; i < ndim(); ++i)
    s += (i ? ", \"" : "\"") + names_[i] + "\"=" + std::to_string(shape_[i]);
  return s + ")";
}

namespace {

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i)
    out += s;
  return out;
}

// One 2-D grid of `rows` x `cols` device ids starting at `first`, with `row_label` /
// `col_label` naming the axes. Box-drawing characters are one column wide each, so the
// padding is computed on the ASCII parts only.
void print_grid(std::ostringstream& os, int first, int rows, int cols, int row_stride,
                const std::string& row_label, const std::string& col_label, int cell) {
  const std::string pad(row_label.size() + 3, ' ');
  auto border = [&](const char* l, const char* m, const char* r) {
    std::string line = pad + l;
    for (int c = 0; c < cols; ++c)
      line += repeat("─", cell) + (c + 1 < cols ? m : r);
    return line + "\n";
  };
  os << pad << " " << col_label << " →\n";
  os << border("┌", "┬", "┐");
  for (int r = 0; r < rows; ++r) {
    std::string head = r == 0 ? row_label : std::string(row_label.size(), ' ');
    os << head << (r == 0 && !row_label.empty() ? " ↓ " : "   ") << "│";
    for (int c = 0; c < cols; ++c) {
      std::string id = std::to_string(first + r * row_stride + c);
      const int left = (cell - static_cast<int>(id.size())) / 2;
      os << std::string(left, ' ') << id << std::string(cell - left - id.size(), ' ') << "│";
    }
    os << "\n";
    if (r + 1 < rows) os << border("├", "┼", "┤");
  }
  os << border("└", "┴", "┘");
}

}  // namespace

std::string Mesh::to_string() const {
  std::ostringstream os;
  os << "Mesh " << describe() << ", " << size_ << " device" << (size_ == 1 ? "" : "s") << "\n";
  const int cell = static_cast<int>(std::to_string(size_ - 1).size()) + 2;
  auto label = [&](int i) { return names_[i] + " (" + std::to_string(shape_[i]) + ")"; };
  if (ndim() == 1) {
    print_grid(os, 0, 1, shape_[0], shape_[0], "", label(0), cell);
    return os.str();
  }
  const int rows = shape_[ndim() - 2], cols = shape_[ndim() - 1];
  const int lead = size_ / (rows * cols);
  std::string row_label = label(ndim() - 2);
  for (int s = 0; s < lead; ++s) {
    if (lead > 1) {
      // Coordinates of this slice along the leading axes.
      std::vector<int> c = coords(s * rows * cols);
      os << "[";
      for (int i = 0; i < ndim() - 2; ++i)
        os << (i ? ", " : "") << names_[i] << "=" << c[i];
      os << "]\n";
    }
    print_grid(os, s * rows * cols, rows, cols, cols, row_label, label(ndim() - 1), cell);
  }
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Mesh& mesh) {
  return os << mesh.to_string();
}

}  // namespace distjax::mesh
