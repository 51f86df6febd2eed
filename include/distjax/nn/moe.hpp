// MoE: a Mixture-of-Experts feed-forward layer. A router picks each token's top-k experts,
// the tokens are dispatched into the expert order, every expert's MLP runs as one grouped
// product over its rows, and the outputs are combined back with the gates (Switch, GShard,
// Megatron-Core's MoELayer, torchtitan's MoE).
// Shape legend: N tokens (B T), C width, E experts, k slots per token, H expert hidden width.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "distjax/nn/scope.hpp"

namespace distjax::tensor {
struct DispatchPlan;
}

namespace distjax::nn {

/// The mesh axis experts are split over (expert parallelism): a device holds E / n of each
/// layer's experts, and the tokens travel to their experts' devices and back.
inline constexpr const char* kExpertAxis = "expert";
/// The size of that axis in the scope's mesh; 1 without a device context or the axis.
int expert_parallel_size(const Scope& scope);

/// The balancing biases' step (MoE::balance_bias_rate): for each bias path of `loads` (the
/// step's pairs routed per expert, summed over its micro-batches and every device that saw
/// other tokens), bias[e] += rate * sign(mean load - load[e]) in place in `params`.
void balance_bias_update(tensor::TensorTree& params,
                         const std::map<std::string, std::vector<double>>& loads, double rate);

/// x (..., C) -> (..., C), in f32:
///   probs = softmax(x Wr) over the E experts (f32);  experts = top_k(probs)  (N, k)
///   gates = probs at the chosen experts (renormalised to sum 1 with `renormalize`)
///   y[t]  = sum_s gates[t, s] * expert_{experts[t, s]}(x[t])   (+ shared(x[t]))
/// an expert being gelu_tanh(x W1_e) W2_e, or with `swiglu` (silu(x Wg_e) * (x W1_e)) W2_e;
/// no biases. Dropless (capacity_factor < 0), or each expert keeps at most
/// ceil(capacity_factor N k / E) of its (token, slot) pairs, the first in token order or with
/// `drop_by_probability` those of the highest gates; a dropped pair adds nothing.
/// Parameters: "router/kernel" (C, E), "experts/fc1" (E, C, H), "experts/gate" (E, C, H)
/// with swiglu, "experts/fc2" (E, H, C), and with shared_experts a dense MLPBlock "shared"
/// of hidden shared_experts * H.
///
/// Its balancing losses join the objective through the backward pass (autodiff::add_loss
/// on the output, scaled as the objective is): aux_loss_coef * aux_loss and z_loss_coef *
/// z_loss, when > 0. On a scope that is sowing (Scope::sowing) it reports, per call, the
///   metrics "aux_loss" = E sum_e f_e P_e (Switch/GShard: f_e the fraction of the N k pairs
///   routed to e, P_e the mean router probability of e; 1 when balanced), "z_loss" = the mean
///   over tokens of logsumexp(router logits)^2, "expert_load_max_over_mean" (pairs routed to
///   the busiest expert over the mean), "dropped_fraction" (of the N k pairs).
/// The statistics are over the tokens this call sees (a device's batch). With
/// balance_bias_rate it also sows its loads (Scope::sow_loads: the pairs routed to each
/// expert, under the path of its bias).
///
/// Expert parallelism: on a scope bound to a device of a mesh with an "expert" axis of n
/// devices (which see different tokens, as data replicas do), the experts' parameters are
/// split over it (PartitionSpec P("expert") on their first dimension: E / n per device).
/// Each device routes its own tokens, the devices exchange their counts per expert
/// (all_gather), then the rows (spmd::ragged_all_to_all) to the devices holding their
/// experts, which run them and send the outputs back to be combined. The experts'
/// gradients are scaled by 1 / n, so that with the other parameters' averaged over the
/// axis the step is the one-device step on all the axis's tokens.
///
/// Two dispatchers move the tokens (Megatron-Core's two): `AllToAll` as above, optionally in
/// `exchange_chunks` chunks (each device's rows for each device split in that many parts)
/// whose exchanges overlap the experts' products: chunk c + 1 travels while the experts run
/// on chunk c, and chunk c's outputs travel back while they run on chunk c + 1 (the
/// backward pass mirrors it); `AllGather`: every device gathers the axis's tokens, gates
/// and choices (all_gather), runs its experts on the pairs routed to them, and the gated
/// outputs are summed back to their devices (psum_scatter): more bytes, no counts
/// exchanged, and the same result within rounding.
///
///   Tensor y = nn::MoE{.num_experts = 8, .top_k = 2}(scope.child("moe"), x);
struct MoE {
  /// How tokens reach experts on other devices of the expert axis (see above).
  enum class Dispatcher { AllToAll, AllGather };

  std::int64_t num_experts = 8;  ///< E
  std::int64_t top_k = 2;        ///< k, 1..8 and at most E
  std::int64_t hidden = 0;       ///< H; 0 means 4 C
  bool swiglu = false;           ///< SwiGLU experts instead of GELU (tanh form) ones
  /// < 0: dropless; > 0: the capacity factor (0 is refused: every pair would drop).
  double capacity_factor = -1;
  bool drop_by_probability = false;  ///< over capacity keep the highest gates (else the first)
  bool renormalize = false;          ///< the k gates of a token divided by their sum
  std::int64_t shared_experts = 0;   ///< a dense MLP of shared_experts * H beside the experts
  double aux_loss_coef = 0;          ///< the load-balancing loss's weight in the objective
  double z_loss_coef = 0;            ///< the router z-loss's weight in the objective
  /// > 0: the auxiliary-loss-free balancing of DeepSeek-V3. A bias "router/bias" (E, zeros at
  /// init) is added to the router's probabilities for the top-k selection only (the gates
  /// stay the probabilities); after each optimizer step the model's update
  /// (balance_bias_update) moves it by this rate times the sign of each expert's load error
  /// (the mean load minus its own), outside the gradient.
  double balance_bias_rate = 0;
  /// Scale of the output projections' initialisation (GPT-2's 1 / sqrt(2 L)).
  double out_scale = 1.0;
  Dispatcher dispatcher = Dispatcher::AllToAll;
  /// AllToAll: the exchange in this many chunks, overlapped with the experts (1: none).
  std::int64_t exchange_chunks = 1;
  /// Expert tensor parallelism: a mesh axis (e.g. "model") over which each expert's hidden
  /// width is split (fc1 and gate by columns, fc2 by rows: P(.., None, axis) and
  /// P(.., axis, None)), as Megatron splits a dense MLP, and a shared expert's likewise
  /// (shared/fc1 by columns, shared/fc2 by rows). The layer's input is the same on the
  /// axis's devices, or (sequence_axis the same axis) split over them along the dimension
  /// before the features, then gathered first; each device runs its slice of every expert
  /// and the combined outputs are summed over the axis (psum; psum_scatter back to each
  /// device's share when gathered). Empty, or an axis the mesh lacks: the experts whole.
  std::string tensor_axis{};
  /// The mesh axis the layer's tokens are split over within one objective (Megatron's
  /// sequence parallelism over "model"; empty: none): each device's balancing losses, means
  /// over its tokens (the gathered ones with tensor_axis the same axis), count 1 / n of the
  /// objective's.
  std::string sequence_axis{};

  Tensor operator()(const Scope& scope, const Tensor& x) const;
  /// Checks the settings for a width of `c` (InvalidArgument naming the field).
  void check(std::int64_t c) const;
  /// Parameters of one layer for a width of `c`: router, experts and shared MLP.
  std::int64_t num_params(std::int64_t c) const;
  /// Of them, those a token's products use: the router, k experts and the shared MLP.
  std::int64_t active_params(std::int64_t c) const;
  /// Pairs each expert may keep for `tokens` tokens; -1 when dropless.
  std::int64_t capacity(std::int64_t tokens) const;

 private:
  // Expert parallelism, all-to-all: xp's rows to their experts' devices, the local experts,
  // and back (in exchange_chunks overlapped chunks). `meanwhile` runs once the rows are on
  // their way, before the first chunk is waited on (the shared expert).
  Tensor exchange_and_run(const Scope& scope, const Tensor& xp, const tensor::DispatchPlan& plan,
                          const Tensor& w1, const Tensor& wg, const Tensor& w2,
                          const std::function<void()>& meanwhile) const;
  // Expert parallelism, all-gather: the combined output (N, C) of this device's tokens.
  Tensor gather_and_run(const Scope& scope, const Tensor& x, const Tensor& chosen,
                        const Tensor& gates, const Tensor& w1, const Tensor& wg,
                        const Tensor& w2) const;
};

}  // namespace distjax::nn
