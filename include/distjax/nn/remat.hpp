// Rematerialisation of a module by name: run a piece of a model under
// autodiff::checkpoint so its activations are recomputed in the backward pass.
#pragma once

#include <functional>

#include "distjax/nn/scope.hpp"

namespace distjax::nn {

/// A module applied to one input on a scope: (scope, x) -> y. It must capture what it
/// needs by value: a rematerialised one runs again during the backward pass.
using ScopedFn = std::function<tensor::Tensor(const Scope& scope, const tensor::Tensor& x)>;

/// f(scope, x); with `on` (and parameters applied with grad mode on) under
/// autodiff::checkpoint: the same values and gradients, f's intermediate activations
/// recomputed in backward instead of kept. Everything f differentiates must come from the
/// scope's parameters or x (the scope is rebased onto the checkpoint's parameter leaves).
///
///   Tensor h = nn::remat_call(remat_mlp, scope, y, [mlp, ln](const Scope& s, const Tensor& in) {
///     return mlp(s.child("mlp"), ln(s.child("ln2"), in));
///   });
tensor::Tensor remat_call(bool on, const Scope& scope, const tensor::Tensor& x, const ScopedFn& f);

}  // namespace distjax::nn
