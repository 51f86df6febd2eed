#include "distjax/global/reduce.hpp"

#include "distjax/global/detail/rule_util.hpp"
#include "distjax/global/elementwise.hpp"
#include "distjax/tensor/reduce.hpp"

namespace distjax::global {

using detail::Entry;

namespace {

std::vector<bool> reduced_mask(const Shape& shape, const std::vector<int>& dims, const char* op) {
  const int r = static_cast<int>(shape.size());
  std::vector<bool> red(static_cast<std::size_t>(r), false);
  for (int d : dims) {
    const int n = d < 0 ? d + r : d;
    DISTJAX_CHECK(n >= 0 && n < r, InvalidArgument, "[global::", op, "] dimension ", d,
                  " out of range for shape ", to_string(shape));
    red[static_cast<std::size_t>(n)] = true;
  }
  return red;
}

OpRule reduce_rule(const Shape& shape, const GlobalSharding& s, const std::vector<int>& dims,
                   bool keepdims, const Mesh& mesh, bool linear) {
  const auto red = reduced_mask(shape, dims, linear ? "sum" : "max");
  const auto e = dim_entries(s, static_cast<int>(shape.size()));
  std::vector<Entry> din, dout;
  std::vector<std::string> pout = linear ? s.partial : std::vector<std::string>{};
  for (std::size_t d = 0; d < e.size(); ++d) {
    if (red[d]) {
      din.push_back(linear ? e[d] : Entry{});
      if (linear) pout.insert(pout.end(), e[d].begin(), e[d].end());
      if (keepdims) dout.emplace_back();
    } else {
      din.push_back(e[d]);
      dout.push_back(e[d]);
    }
  }
  OpRule r;
  r.inputs.push_back(make_sharding(din, linear ? s.partial : std::vector<std::string>{}, mesh));
  r.output = make_sharding(dout, pout, mesh);
  r.bytes = redistribution_bytes(shape, s, r.inputs[0], mesh);
  return r;
}

Shape reduced_shape(const Shape& shape, const std::vector<bool>& red, bool keepdims) {
  Shape out;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (!red[d])
      out.push_back(shape[d]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

std::vector<int> all_dims(int r) {
  std::vector<int> d(static_cast<std::size_t>(r));
  for (int i = 0; i < r; ++i)
    d[static_cast<std::size_t>(i)] = i;
  return d;
}

}  // namespace

OpRule sum_rule(const Shape& shape, const GlobalSharding& s, const std::vector<int>& dims,
                bool keepdims, const Mesh& mesh) {
  return reduce_rule(shape, s, dims, keepdims, mesh, true);
}

OpRule max_rule(const Shape& shape, const GlobalSharding& s, const std::vector<int>& dims,
                bool keepdims, const Mesh& mesh) {
  return reduce_rule(shape, s, dims, keepdims, mesh, false);
}

GlobalArray sum(const GlobalArray& x, const std::vector<int>& dims, bool keepdims) {
  const OpRule r = sum_rule(x.shape(), x.sharding(), dims, keepdims, x.mesh());
  const auto red = reduced_mask(x.shape(), dims, "sum");
  std::vector<int> nd;
  for (std::size_t d = 0; d < red.size(); ++d)
    if (red[d]) nd.push_back(static_cast<int>(d));
  Tensor t = nd.empty() ? x.local() : tensor::sum(x.local(), nd, keepdims);
  return GlobalArray(x.ctx(), t, reduced_shape(x.shape(), red, keepdims), r.output);
}

GlobalArray sum(const GlobalArray& x) {
  return sum(x, all_dims(x.rank()), false);
}

GlobalArray mean(const GlobalArray& x, const std::vector<int>& dims, bool keepdims) {
  const auto red = reduced_mask(x.shape(), dims, "mean");
  std::int64_t count = 1;
  for (std::size_t d = 0; d < red.size(); ++d)
    if (red[d]) count *= x.shape()[d];
  return mul_scalar(sum(x, dims, keepdims), 1.0 / static_cast<double>(count));
}

GlobalArray mean(const GlobalArray& x) {
  return mean(x, all_dims(x.rank()), false);
}

GlobalArray max(const GlobalArray& x, const std::vector<int>& dims, bool keepdims) {
  const OpRule r = max_rule(x.shape(), x.sharding(), dims, keepdims, x.mesh());
  const std::uint32_t keep = detail::sharding_mask(x.ctx(), r.output);
  const GlobalArray m = reshard(x, r.inputs[0], "max", keep);
  const auto red = reduced_mask(x.shape(), dims, "max");
  std::vector<int> nd;
  for (std::size_t d = 0; d < red.size(); ++d)
    if (red[d]) nd.push_back(static_cast<int>(d));
  return GlobalArray(x.ctx(), tensor::max(m.local(), nd, keepdims),
                     reduced_shape(x.shape(), red, keepdims), r.output);
}

}  // namespace distjax::global
