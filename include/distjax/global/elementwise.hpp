// Global-view elementwise ops (with NumPy broadcasting) and their propagation rule.
#pragma once

#include <functional>
#include <vector>

#include "distjax/global/global_array.hpp"
#include "distjax/global/op_rule.hpp"

namespace distjax::global {

/// How an elementwise op treats partial sums (DTensor's linearity).
enum class Linearity {
  Sum,       // add, sub: partial over p stays partial when EVERY input is partial over p
  Product,   // mul: one input's partial passes when the others are replicated along p
  Quotient,  // div: the numerator's partial passes when the denominator is replicated
  None,      // nonlinear: every partial sum is resolved first
};

/// The rule of an elementwise op over inputs broadcast to a common shape (dimensions
/// aligned from the end; a size-1 dimension broadcasts and is replicated). Each output
/// dimension takes the split of the largest input that splits it (the others are split
/// locally to match, no communication when they are replicated), each mesh axis at most
/// once; partial sums pass as `lin` allows, the rest are resolved.
///   P("data", "model") + bias P("model")        -> P("data", "model"), 0 bytes
///   P() partial("model") + P() partial("model") -> P() partial("model"), 0 bytes
///   P() partial("model") + bias P()            -> P(), one all_reduce
OpRule elementwise_rule(const std::vector<Shape>& shapes, const std::vector<GlobalSharding>& in,
                        Linearity lin, const Mesh& mesh);

/// Runs `fn` on the local blocks after resharding by elementwise_rule.
GlobalArray elementwise(const char* op, const std::vector<GlobalArray>& xs, Linearity lin,
                        const std::function<Tensor(const std::vector<Tensor>&)>& fn);

GlobalArray add(const GlobalArray& a, const GlobalArray& b);
GlobalArray sub(const GlobalArray& a, const GlobalArray& b);
GlobalArray mul(const GlobalArray& a, const GlobalArray& b);
GlobalArray div(const GlobalArray& a, const GlobalArray& b);
/// Linear unary ops keep partial sums.
GlobalArray neg(const GlobalArray& x);
GlobalArray mul_scalar(const GlobalArray& x, double s);
/// Nonlinear unary ops resolve partial sums first; splits pass unchanged.
GlobalArray add_scalar(const GlobalArray& x, double s);
GlobalArray relu(const GlobalArray& x);
GlobalArray gelu(const GlobalArray& x, bool approximate = true);
GlobalArray silu(const GlobalArray& x);
GlobalArray tanh(const GlobalArray& x);
GlobalArray exp(const GlobalArray& x);
GlobalArray log(const GlobalArray& x);
GlobalArray square(const GlobalArray& x);

inline GlobalArray operator+(const GlobalArray& a, const GlobalArray& b) {
  return add(a, b);
}
inline GlobalArray operator-(const GlobalArray& a, const GlobalArray& b) {
  return sub(a, b);
}
inline GlobalArray operator*(const GlobalArray& a, const GlobalArray& b) {
  return mul(a, b);
}

}  // namespace distjax::global
