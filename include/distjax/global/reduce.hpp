// Global-view reductions (sum, mean, max) and their propagation rules.
#pragma once

#include <vector>

#include "distjax/global/global_array.hpp"
#include "distjax/global/op_rule.hpp"

namespace distjax::global {

/// The rule of sum / mean over `dims`: no input movement; a reduced dimension split
/// over axes makes the output partial over them (each device summed its block); the
/// kept dimensions keep their splits (keepdims: reduced dims become replicated size 1).
///   sum(P("data", "model"), {1}) -> P("data") partial("model"), 0 bytes
///   sum(P("data"), all)          -> P() partial("data"), 0 bytes
OpRule sum_rule(const Shape& shape, const GlobalSharding& s, const std::vector<int>& dims,
                bool keepdims, const Mesh& mesh);
/// The rule of max over `dims`: reduced dims are gathered, partial sums resolved.
OpRule max_rule(const Shape& shape, const GlobalSharding& s, const std::vector<int>& dims,
                bool keepdims, const Mesh& mesh);

GlobalArray sum(const GlobalArray& x, const std::vector<int>& dims, bool keepdims = false);
/// Sum of every element: a scalar.
GlobalArray sum(const GlobalArray& x);
/// sum divided by the GLOBAL number of reduced elements.
GlobalArray mean(const GlobalArray& x, const std::vector<int>& dims, bool keepdims = false);
GlobalArray mean(const GlobalArray& x);
GlobalArray max(const GlobalArray& x, const std::vector<int>& dims, bool keepdims = false);

}  // namespace distjax::global
