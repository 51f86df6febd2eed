#include "distjax/nn/transformer_block.hpp"

#include "distjax/autodiff/autodiff.hpp"
#include "distjax/nn/dropout.hpp"
#include "distjax/nn/layer_norm.hpp"
#include "distjax/nn/mlp_block.hpp"
#include "distjax/nn/multi_head_attention.hpp"
#include "distjax/nn/remat.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/grad_node.hpp"

namespace distjax::nn {

Tensor TransformerBlock::body(const Scope& scope, const Tensor& x) const {
  // ln1 and ln2 feed only the attention's and the MLP's first projections.
  const LayerNorm ln{.eps = ln_eps, .to_compute = true};
  const Dropout drop{.rate = dropout};
  const MultiHeadAttention attn{.num_heads = num_heads,
                                .causal = causal,
                                .kernel_init = kernel_init,
                                .out_init = out_init,
                                .segments = segments};
  const MLPBlock mlp{.hidden = mlp_hidden, .kernel_init = kernel_init, .out_init = out_init};
  if (moe) {
    // The experts' output is added here (no residual in their products).
    const Tensor h = remat_call(remat_attn, scope, x, [ln, attn](const Scope& s, const Tensor& in) {
      return attn(s.child("attn").module("Attn"), ln(s.child("ln1"), in));
    });
    const Tensor y = tensor::add(x, drop(scope.child("attn_dropout"), h));
    const Tensor m =
        remat_call(remat_mlp, scope, y, [ln, moe = *moe](const Scope& s, const Tensor& in) {
          return moe(s.child("moe").module("MLP"), ln(s.child("ln2"), in));
        });
    return tensor::add(y, drop(scope.child("mlp_dropout"), m));
  }
  if (dropout == 0.f) {
    // The residual adds in the out projections' products (no dropout between).
    const Tensor y = remat_call(remat_attn, scope, x, [ln, attn](const Scope& s, const Tensor& in) {
      return attn(s.child("attn").module("Attn"), ln(s.child("ln1"), in), in);
    });
    return remat_call(remat_mlp, scope, y, [ln, mlp](const Scope& s, const Tensor& in) {
      return mlp(s.child("mlp").module("MLP"), ln(s.child("ln2"), in), in);
    });
  }
  Tensor h = remat_call(remat_attn, scope, x, [ln, attn](const Scope& s, const Tensor& in) {
    return attn(s.child("attn").module("Attn"), ln(s.child("ln1"), in));
  });
  Tensor y = tensor::add(x, drop(scope.child("attn_dropout"), h));
  h = remat_call(remat_mlp, scope, y, [ln, mlp](const Scope& s, const Tensor& in) {
    return mlp(s.child("mlp").module("MLP"), ln(s.child("ln2"), in));
  });
  return tensor::add(y, drop(scope.child("mlp_dropout"), h));
}

Tensor TransformerBlock::operator()(const Scope& scope, const Tensor& x) const {
  tensor::check_defined(x, "TransformerBlock", "x");
  DISTJAX_CHECK(x.rank() == 3, InvalidArgument, "[TransformerBlock] \"", scope.path(),
                "\" expects x (B, T, C), got ", to_string(x.shape()));
  if (!remat || scope.is_init() || !tensor::grad_enabled()) return body(scope, x);
  // Everything differentiated must enter through the checkpoint's params and inputs,
  // so the block runs on a scope rebased onto the subtree handed back by checkpoint.
  const TransformerBlock self = *this;
  autodiff::RematFn fn = [self, scope](const TensorTree& p, const std::vector<Tensor>& in) {
    const Scope s = scope.rebased(&p);
    return std::vector<Tensor>{self.body(s, in[0])};
  };
  return autodiff::checkpoint(fn, scope.params(), {x})[0];
}

}  // namespace distjax::nn
