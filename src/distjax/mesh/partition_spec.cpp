// PartitionSpec: entries, lookups and printing.
#include "distjax/mesh/partition_spec.hpp"

namespace distjax::mesh {

PartitionSpec PartitionSpec::from_entries(std::vector<Entry> entries) {
  PartitionSpec s;
  s.entries_ = std::move(entries);
  return s;
}

PartitionSpec::Entry PartitionSpec::entry(int dim) const {
  if (dim >= 0 && dim < size()) return entries_[dim];
  return Entry(std::nullopt);
}

std::vector<std::string> PartitionSpec::used_axes() const {
  std::vector<std::string> out;
  for (const auto& e : entries_)
    out.insert(out.end(), e.axes.begin(), e.axes.end());
  return out;
}

bool PartitionSpec::uses(const std::string& axis) const {
  for (const auto& e : entries_)
    for (const auto& a : e.axes)
      if (a == axis) return true;
  return false;
}

std::string PartitionSpec::to_string() const {
  std::string s = "P(";
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (i) s += ", ";
    const auto& ax = entries_[i].axes;
    if (ax.empty()) {
      s += "None";
    } else if (ax.size() == 1) {
      s += "\"" + ax[0] + "\"";
    } else {
      s += "(";
      for (std::size_t j = 0; j < ax.size(); ++j)
        s += (j ? ", \"" : "\"") + ax[j] + "\"";
      s += ")";
    }
  }
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const PartitionSpec& spec) {
  return os << spec.to_string();
}

}  // namespace distjax::mesh
