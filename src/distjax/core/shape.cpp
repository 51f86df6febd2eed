#include "distjax/core/shape.hpp"

#include "distjax/core/dtype.hpp"
#include "distjax/core/error.hpp"

namespace distjax {

std::int64_t numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s)
    n *= d;
  return n;
}

std::string to_string(const Shape& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  if (s.size() == 1) out += ",";
  return out + ")";
}

int normalize_axis(int axis, int rank, const char* op) {
  int a = axis < 0 ? axis + rank : axis;
  DISTJAX_CHECK(a >= 0 && a < rank, InvalidArgument, "[", op, "] axis ", axis,
                " is out of range for rank ", rank);
  return a;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  std::size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (std::size_t i = 0; i < r; ++i) {
    std::int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    std::int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    DISTJAX_CHECK(da == db || da == 1 || db == 1, InvalidArgument, "[", op, "] shapes ",
                  to_string(a), " and ", to_string(b), " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<std::int64_t> contiguous_strides(const Shape& s) {
  std::vector<std::int64_t> st(s.size());
  std::int64_t acc = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::F64:
      return "f64";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64})
    if (n == dtype_name(t)) return t;
  DISTJAX_THROW(InvalidArgument, "[dtype] unknown dtype \"", n,
                "\" (expected f32, bf16, f16, i32, i64)");
}

}  // namespace distjax
