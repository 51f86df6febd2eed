// Shapes: a small vector of dimension sizes, with helpers for element counts,
// printing and broadcasting.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace distjax {

/// Dimension sizes, outermost first. A rank-0 shape {} is a scalar.
using Shape = std::vector<std::int64_t>;

/// Product of the dimensions (1 for a scalar).
std::int64_t numel(const Shape& s);
/// "(2, 3, 4)".
std::string to_string(const Shape& s);
/// Normalises a possibly negative axis against a rank; throws InvalidArgument naming `op`.
int normalize_axis(int axis, int rank, const char* op);
/// NumPy broadcasting of two shapes; throws InvalidArgument naming `op` if incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
/// Row-major strides in elements.
std::vector<std::int64_t> contiguous_strides(const Shape& s);

}  // namespace distjax
