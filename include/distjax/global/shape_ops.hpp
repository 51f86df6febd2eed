// Global-view shape ops (reshape, transpose / permute, slice, concat) and their rules.
#pragma once

#include <vector>

#include "distjax/global/global_array.hpp"
#include "distjax/global/op_rule.hpp"

namespace distjax::global {

/// Rule of reshape: dimensions are matched in groups of equal product; in each group the
/// split of the first (major) input dimension carries over to the first output
/// dimension when that one is divisible by it (each device's block stays contiguous);
/// other splits in the group are gathered. Partial sums pass (reshape is linear).
///   (B, T, C) P("data")             -> (B T, C)       P("data"), 0 bytes
///   (B, T, 3C) P(None, None, "model") -> (B, T, H, 3, D) P(None, None, "model"), 0 bytes
OpRule reshape_rule(const Shape& in, const GlobalSharding& s, const Shape& out, const Mesh& mesh);
GlobalArray reshape(const GlobalArray& x, const Shape& shape);

/// permute / transpose move the entries with their dimensions; no communication.
GlobalArray permute(const GlobalArray& x, const std::vector<int>& perm);
GlobalArray transpose(const GlobalArray& x, int d0 = -2, int d1 = -1);

/// Rule of slice along `axis`: that dimension is gathered unless [start, end) is all
/// of it; the others keep their splits; partial sums pass.
OpRule slice_rule(const Shape& shape, const GlobalSharding& s, int axis, std::int64_t start,
                  std::int64_t end, const Mesh& mesh);
GlobalArray slice(const GlobalArray& x, int axis, std::int64_t start, std::int64_t end);

/// Rule of concat along `axis`: every input takes the first input's splits on the other
/// dimensions and none along `axis`; a partial axis passes when every input has it.
OpRule concat_rule(const std::vector<Shape>& shapes, const std::vector<GlobalSharding>& in,
                   int axis, const Mesh& mesh);
GlobalArray concat(const std::vector<GlobalArray>& xs, int axis);

}  // namespace distjax::global
