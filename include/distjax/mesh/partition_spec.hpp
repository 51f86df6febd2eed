// PartitionSpec (alias P): how each dimension of an array maps onto mesh axes.
#pragma once

#include <initializer_list>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace distjax::mesh {

/// One entry per array dimension, in dimension order (not mesh order). An entry is
/// none (the dimension is replicated), one axis name (split along that axis), or
/// several axis names (split along their product, the first name major). Mesh axes
/// not named anywhere in the spec are axes the array is replicated along. Trailing
/// dimensions beyond the spec's length are replicated.
///
///   P()                              // fully replicated
///   P("data")                        // dim 0 split over "data"
///   P("data", std::nullopt, "model") // (B, T, C): B over data, C over model
///   P({"data", "model"})             // dim 0 split over data x model (JAX P(("data","model")))
///   P(std::nullopt, {"data", "pipe"})
class PartitionSpec {
 public:
  /// One entry: the axis names a dimension is split over (empty = replicated).
  struct Entry {
    std::vector<std::string> axes;
    Entry(std::nullopt_t) {}                                   // NOLINT: implicit
    Entry(const char* axis) : axes{axis} {}                    // NOLINT: implicit
    Entry(std::string axis) : axes{std::move(axis)} {}         // NOLINT: implicit
    Entry(std::initializer_list<std::string> a) : axes(a) {}   // NOLINT: implicit
    Entry(std::vector<std::string> a) : axes(std::move(a)) {}  // NOLINT: implicit
    Entry(std::optional<std::string> axis) {                   // NOLINT: implicit
      if (axis) axes.push_back(std::move(*axis));
    }
    bool replicated() const { return axes.empty(); }
    friend bool operator==(const Entry&, const Entry&) = default;
  };

  PartitionSpec() = default;
  // Fixed arities instead of a variadic template, so that a braced list is read as
  // ONE multi-axis entry: P({"data", "model"}) is one entry, P("data", "model") two.
  // The initializer_list constructor below is what makes P({...}) unambiguous (a list
  // converting to std::initializer_list beats the copy constructor).
  PartitionSpec(Entry a) : entries_{std::move(a)} {}  // NOLINT: implicit
  /// One multi-axis entry: P({"data", "model"}). (Because of this constructor a
  /// braced P{"data", "model"} is ALSO one entry; write two entries with parentheses.)
  PartitionSpec(std::initializer_list<std::string> axes)  // NOLINT: implicit
      : entries_{Entry(std::vector<std::string>(axes))} {}
  PartitionSpec(Entry a, Entry b) : entries_{std::move(a), std::move(b)} {}
  PartitionSpec(Entry a, Entry b, Entry c) : entries_{std::move(a), std::move(b), std::move(c)} {}
  PartitionSpec(Entry a, Entry b, Entry c, Entry d)
      : entries_{std::move(a), std::move(b), std::move(c), std::move(d)} {}
  PartitionSpec(Entry a, Entry b, Entry c, Entry d, Entry e)
      : entries_{std::move(a), std::move(b), std::move(c), std::move(d), std::move(e)} {}
  PartitionSpec(Entry a, Entry b, Entry c, Entry d, Entry e, Entry f)
      : entries_{std::move(a), std::move(b), std::move(c),
                 std::move(d), std::move(e), std::move(f)} {}
  /// A spec from a list of entries built at run time.
  static PartitionSpec from_entries(std::vector<Entry> entries);

  /// Number of entries (dimensions the spec talks about).
  int size() const { return static_cast<int>(entries_.size()); }
  const std::vector<Entry>& entries() const { return entries_; }
  /// Entry `dim`; dimensions past the end are replicated.
  Entry entry(int dim) const;
  /// Every axis name used, in entry order.
  std::vector<std::string> used_axes() const;
  /// Whether `axis` is named by some entry.
  bool uses(const std::string& axis) const;

  /// `P("data", None, ("data", "model"))`.
  std::string to_string() const;
  friend bool operator==(const PartitionSpec&, const PartitionSpec&) = default;

 private:
  std::vector<Entry> entries_;
};

/// JAX's spelling.
using P = PartitionSpec;

std::ostream& operator<<(std::ostream& os, const PartitionSpec& spec);

}  // namespace distjax::mesh
