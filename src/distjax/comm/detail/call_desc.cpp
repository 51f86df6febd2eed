// Call descriptors and the messages built from them (see call_desc.hpp).
#include "distjax/comm/detail/call_desc.hpp"

#include <algorithm>
#include <sstream>

#include "distjax/core/device.hpp"

namespace distjax::comm::detail {

bool CallDesc::operator==(const CallDesc& o) const {
  return seq == o.seq && count == o.count && pairs_hash == o.pairs_hash && root == o.root &&
         op == o.op && dtype == o.dtype && reduce == o.reduce && device == o.device;
}

CallDesc make_desc(std::uint64_t seq, OpKind op, std::int64_t count, DType dtype, ReduceOp reduce,
                   int root, std::uint64_t pairs_hash) {
  CallDesc d;
  d.seq = seq;
  d.op = static_cast<std::uint8_t>(op);
  d.count = count;
  d.dtype = static_cast<std::uint8_t>(dtype);
  d.reduce = static_cast<std::uint8_t>(reduce);
  d.root = root;
  d.pairs_hash = pairs_hash;
  return d;
}

std::string describe(const CallDesc& d) {
  auto op = static_cast<OpKind>(d.op);
  std::ostringstream os;
  os << op_kind_name(op);
  if (op == OpKind::Barrier || op == OpKind::Split) return os.str() + "()";
  if (op == OpKind::AllToAll && d.count == kVariableCount) {
    os << "v(" << dtype_name(static_cast<DType>(d.dtype));
    if (d.device != 0) os << ", on " << device_kind_name(static_cast<DeviceKind>(d.device));
    return os.str() + ")";
  }
  os << "(count=" << d.count << ", " << dtype_name(static_cast<DType>(d.dtype));
  if (op == OpKind::AllReduce || op == OpKind::ReduceScatter)
    os << ", " << reduce_op_name(static_cast<ReduceOp>(d.reduce));
  if (op == OpKind::Broadcast) os << ", root=" << d.root;
  if (op == OpKind::Permute) os << ", pairs#" << std::hex << (d.pairs_hash & 0xffff) << std::dec;
  if (d.device != 0) os << ", on " << device_kind_name(static_cast<DeviceKind>(d.device));
  os << ")";
  return os.str();
}

std::string join_ints(const std::vector<int>& v) {
  std::ostringstream os;
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}

std::string join_ranges(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (i) s.push_back(',');  // appended: g++ 12 warns falsely (-Wrestrict) on operator+
    s.append(std::to_string(v[i]));
    if (j > i) {
      s.push_back('-');
      s.append(std::to_string(v[j]));
    }
    i = j + 1;
  }
  return s;
}

std::string devices_in_ranges(const std::vector<int>& v) {
  return (v.size() == 1 ? "device " : "devices ") + join_ranges(v);
}

std::string group_label(const std::vector<int>& members) {
  std::string s = "(";  // appended, not operator+: g++ 12 warns falsely (-Wrestrict) there
  s.append(join_ints(members));
  s.push_back(')');
  return s;
}

std::string mismatch_message(const std::vector<CallDesc>& descs,
                             const std::vector<int>& members) {
  bool same = std::all_of(descs.begin(), descs.end(), [&](const CallDesc& d) {
    return d == descs[0];
  });
  if (same) return {};
  // Group the devices by what they called, in order of first appearance.
  std::vector<std::pair<std::string, std::vector<int>>> variants;
  std::vector<std::string> ops;
  for (std::size_t r = 0; r < descs.size(); ++r) {
    std::string what = describe(descs[r]);
    if (descs[r].seq != descs[0].seq) what += " as call #" + std::to_string(descs[r].seq);
    auto it = std::find_if(variants.begin(), variants.end(),
                           [&](const auto& v) { return v.first == what; });
    if (it == variants.end()) {
      variants.push_back({what, {members[r]}});
    } else {
      it->second.push_back(members[r]);
    }
    std::string name = op_kind_name(static_cast<OpKind>(descs[r].op));
    if (std::find(ops.begin(), ops.end(), name) == ops.end()) ops.push_back(name);
  }
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < ops.size(); ++i) os << (i ? "/" : "") << ops[i];
  os << "] devices disagree at call #" << descs[0].seq << " of group " << group_label(members)
     << ": ";
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const auto& [what, devs] = variants[i];
    os << (i ? "; " : "") << (devs.size() == 1 ? "device " : "devices ") << join_ints(devs)
       << " called " << what;
  }
  return os.str();
}

std::uint64_t hash_pairs(const std::vector<std::pair<int, int>>& pairs) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the pairs, order-insensitive
  std::vector<std::pair<int, int>> sorted(pairs);
  std::sort(sorted.begin(), sorted.end());
  for (auto [s, d] : sorted) {
    for (int v : {s, d}) {
      h ^= static_cast<std::uint32_t>(v);
      h *= 1099511628211ull;
    }
  }
  return h;
}

std::uint64_t hash_desc(const CallDesc& d) {
  // Word at a time (it runs on every checked call): each field is folded in with a
  // multiply and mixed at the end (splitmix64's finaliser).
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 0xbf58476d1ce4e5b9ull; };
  mix(d.seq);
  mix(static_cast<std::uint64_t>(d.count));
  mix(d.pairs_hash);
  mix(static_cast<std::uint32_t>(d.root) |
      (std::uint64_t(d.op) << 32 | std::uint64_t(d.dtype) << 40 | std::uint64_t(d.reduce) << 48 |
       std::uint64_t(d.device) << 56));
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  return h;
}

}  // namespace distjax::comm::detail
