#include "distjax/global/elementwise.hpp"

#include "distjax/global/detail/rule_util.hpp"
#include "distjax/tensor/elementwise.hpp"

namespace distjax::global {

using detail::Entry;

OpRule elementwise_rule(const std::vector<Shape>& shapes, const std::vector<GlobalSharding>& in,
                        Linearity lin, const Mesh& mesh) {
  const std::size_t k = shapes.size();
  int rank = 0;
  for (const auto& s : shapes)
    rank = std::max(rank, static_cast<int>(s.size()));
  Shape out_shape(static_cast<std::size_t>(rank), 1);
  for (const auto& s : shapes)
    for (std::size_t j = 0; j < s.size(); ++j) {
      auto& o = out_shape[static_cast<std::size_t>(rank) - s.size() + j];
      DISTJAX_CHECK(s[j] == o || s[j] == 1 || o == 1, InvalidArgument,
                    "[global::elementwise] shapes do not broadcast: ", to_string(s), " vs ",
                    to_string(out_shape));
      o = std::max(o, s[j]);
    }
  // Which input dim (or -1) is aligned with out dim d and not broadcast.
  auto aligned = [&](std::size_t i, int d) {
    const int off = rank - static_cast<int>(shapes[i].size());
    const int j = d - off;
    if (j < 0 || shapes[i][static_cast<std::size_t>(j)] != out_shape[static_cast<std::size_t>(d)])
      return -1;
    return j;
  };
  // Inputs by size, largest first: the largest keeps its split.
  std::vector<std::size_t> order(k);
  for (std::size_t i = 0; i < k; ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return numel(shapes[x]) > numel(shapes[y]);
  });
  std::vector<Entry> dout(static_cast<std::size_t>(rank));
  std::vector<std::string> used;
  for (int d = 0; d < rank; ++d) {
    for (std::size_t i : order) {
      const int j = aligned(i, d);
      if (j < 0) continue;
      Entry e = in[i].dim_axes(j);
      if (e.empty()) continue;
      bool ok = true;
      for (const auto& a : e)
        ok = ok && !detail::contains(used, a);
      if (!ok) continue;
      dout[static_cast<std::size_t>(d)] = e;
      used.insert(used.end(), e.begin(), e.end());
      break;
    }
  }
  // Partial sums kept per input.
  std::vector<std::vector<std::string>> keep(k);
  std::vector<std::string> pout;
  auto partial_in_all = [&](const std::string& p) {
    for (const auto& s : in)
      if (!s.is_partial(p)) return false;
    return true;
  };
  if (lin == Linearity::Sum) {
    for (const auto& p : in[0].partial)
      if (!detail::contains(used, p) && partial_in_all(p)) {
        for (auto& kp : keep)
          kp.push_back(p);
        pout.push_back(p);
      }
  } else if (lin == Linearity::Product || lin == Linearity::Quotient) {
    const std::size_t last = lin == Linearity::Quotient ? 1 : k;
    for (std::size_t i = 0; i < last; ++i)
      for (const auto& p : in[i].partial)
        if (!detail::contains(used, p) && !detail::contains(pout, p)) {
          keep[i].push_back(p);
          pout.push_back(p);
        }
  }
  OpRule r;
  for (std::size_t i = 0; i < k; ++i) {
    const int off = rank - static_cast<int>(shapes[i].size());
    std::vector<Entry> di(shapes[i].size());
    for (std::size_t j = 0; j < di.size(); ++j)
      if (aligned(i, static_cast<int>(j) + off) >= 0)
        di[j] = dout[j + static_cast<std::size_t>(off)];
    r.inputs.push_back(make_sharding(di, keep[i], mesh));
    r.bytes += redistribution_bytes(shapes[i], in[i], r.inputs.back(), mesh);
  }
  r.output = make_sharding(dout, pout, mesh);
  return r;
}

GlobalArray elementwise(const char* op, const std::vector<GlobalArray>& xs, Linearity lin,
                        const std::function<Tensor(const std::vector<Tensor>&)>& fn) {
  std::vector<Shape> shapes;
  std::vector<GlobalSharding> in;
  for (const auto& x : xs) {
    shapes.push_back(x.shape());
    in.push_back(x.sharding());
  }
  const OpRule r = elementwise_rule(shapes, in, lin, xs[0].mesh());
  const std::uint32_t keep = detail::sharding_mask(xs[0].ctx(), r.output);
  std::vector<GlobalArray> moved;
  for (std::size_t i = 0; i < xs.size(); ++i)
    moved.push_back(reshard(xs[i], r.inputs[i], op, keep));
  const Tensor out = fn(detail::join_varying(op, moved));
  // The global shape: the broadcast of the inputs'.
  Shape shape = xs[0].shape();
  for (const auto& x : xs) {
    if (x.rank() > static_cast<int>(shape.size()))
      shape.insert(shape.begin(), x.rank() - shape.size(), 1);
    for (int j = 0; j < x.rank(); ++j) {
      auto& o =
          shape[shape.size() - static_cast<std::size_t>(x.rank()) + static_cast<std::size_t>(j)];
      o = std::max(o, x.shape()[static_cast<std::size_t>(j)]);
    }
  }
  return GlobalArray(xs[0].ctx(), out, shape, r.output);
}

namespace {
GlobalArray binary(const char* op, const GlobalArray& a, const GlobalArray& b, Linearity lin,
                   Tensor (*f)(const Tensor&, const Tensor&)) {
  return elementwise(op, {a, b}, lin, [f](const std::vector<Tensor>& t) { return f(t[0], t[1]); });
}
GlobalArray unary(const char* op, const GlobalArray& x, Linearity lin,
                  const std::function<Tensor(const Tensor&)>& f) {
  return elementwise(op, {x}, lin, [&f](const std::vector<Tensor>& t) { return f(t[0]); });
}
}  // namespace

GlobalArray add(const GlobalArray& a, const GlobalArray& b) {
  return binary("add", a, b, Linearity::Sum, tensor::add);
}
GlobalArray sub(const GlobalArray& a, const GlobalArray& b) {
  return binary("sub", a, b, Linearity::Sum, tensor::sub);
}
GlobalArray mul(const GlobalArray& a, const GlobalArray& b) {
  return binary("mul", a, b, Linearity::Product, tensor::mul);
}
GlobalArray div(const GlobalArray& a, const GlobalArray& b) {
  return binary("div", a, b, Linearity::Quotient, tensor::div);
}
GlobalArray neg(const GlobalArray& x) {
  return unary("neg", x, Linearity::Product, [](const Tensor& t) { return tensor::neg(t); });
}
GlobalArray mul_scalar(const GlobalArray& x, double s) {
  return unary("mul_scalar", x, Linearity::Product,
               [s](const Tensor& t) { return tensor::mul_scalar(t, s); });
}
GlobalArray add_scalar(const GlobalArray& x, double s) {
  return unary("add_scalar", x, Linearity::None,
               [s](const Tensor& t) { return tensor::add_scalar(t, s); });
}
GlobalArray relu(const GlobalArray& x) {
  return unary("relu", x, Linearity::None, [](const Tensor& t) { return tensor::relu(t); });
}
GlobalArray gelu(const GlobalArray& x, bool approximate) {
  return unary("gelu", x, Linearity::None,
               [approximate](const Tensor& t) { return tensor::gelu(t, approximate); });
}
GlobalArray silu(const GlobalArray& x) {
  return unary("silu", x, Linearity::None, [](const Tensor& t) { return tensor::silu(t); });
}
GlobalArray tanh(const GlobalArray& x) {
  return unary("tanh", x, Linearity::None, [](const Tensor& t) { return tensor::tanh(t); });
}
GlobalArray exp(const GlobalArray& x) {
  return unary("exp", x, Linearity::None, [](const Tensor& t) { return tensor::exp(t); });
}
GlobalArray log(const GlobalArray& x) {
  return unary("log", x, Linearity::None, [](const Tensor& t) { return tensor::log(t); });
}
GlobalArray square(const GlobalArray& x) {
  return unary("square", x, Linearity::None, [](const Tensor& t) { return tensor::square(t); });
}

}  // namespace distjax::global
