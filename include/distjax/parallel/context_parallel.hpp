// Context parallelism: the sequence split over a mesh axis ("context"), attention computed
// across the split by a ring of key/value blocks (ring attention) or by re-splitting the
// sequence into heads (Ulysses).
//
// Layout: a global sequence of T positions is cut into chunks; the balanced layout (the
// default) cuts it into 2 n chunks for n devices and gives device r chunks r and 2n-1-r,
// so under a causal mask every device has the same attention work (an early chunk, which
// sees few keys, with a late one, which sees many); the plain layout gives device r chunk r.
// A device holds its chunks in ascending order; ContextLayout::positions says where its
// tokens sit in the sequence.
//
// Every function that talks runs inside shard_map, is called by every device of the group in
// the same order, and is differentiable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distjax/nn/dropout.hpp"
#include "distjax/spmd/device_context.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::parallel {

using tensor::Tensor;

/// How a sequence is split over the devices of the context axis.
struct ContextLayout {
  int size = 1;           // devices along the axis (n)
  bool balanced = true;   // 2 n chunks, device r holding r and 2n-1-r; false: n chunks

  /// Chunks per sequence: 2 n balanced, n otherwise.
  int chunks() const { return balanced ? 2 * size : size; }
  /// The chunks device `rank` holds, ascending.
  std::vector<int> chunks_of(int rank) const;
  /// Whether a global sequence of length t splits (t a multiple of chunks()).
  bool divides(std::int64_t t) const { return t > 0 && t % chunks() == 0; }
  /// The global positions of device `rank`'s t / n tokens, in its local order, for a
  /// sequence of global length t (InvalidArgument naming the layout when it does not split).
  std::vector<std::int32_t> positions(int rank, std::int64_t t) const;
  /// Device `rank`'s share of x along dimension `dim` (of global length t): its chunks,
  /// concatenated in ascending order. Differentiable (slices and a concat).
  Tensor shard(const Tensor& x, int dim, int rank) const;
  /// The inverse: the global sequence from every device's share (`shares[r]` of device r).
  Tensor unshard(const std::vector<Tensor>& shares, int dim) const;
  /// The global position where each of device `rank`'s chunks starts, in its local order,
  /// for a sequence of global length t.
  std::vector<std::int64_t> chunk_starts(int rank, std::int64_t t) const;
  /// "balanced (8 chunks over 4 devices)" and the like, for messages.
  std::string describe() const;
};

/// How the attention crosses the split: "ring" (ring_attention) or "ulysses"
/// (ulysses_attention).
enum class ContextMethod : std::uint8_t { Ring, Ulysses };
/// "ring" -> Ring, "ulysses" -> Ulysses; InvalidArgument listing both for any other name.
ContextMethod context_method_from_name(const std::string& name);
const char* context_method_name(ContextMethod m);

/// The context parallelism of a model: the axis, how the sequence splits over it and how the
/// attention crosses the split. Inactive (a layout of size 1): nothing splits.
struct ContextPlan {
  std::string axis = "context";
  ContextLayout layout{};
  ContextMethod method = ContextMethod::Ring;
  /// The ring's transfers overlap the attention (false: each waits; for measuring).
  bool overlap = true;
  bool active() const { return layout.size > 1; }
};

/// Causal (or full) attention of this device's queries over the whole sequence, the keys and
/// values travelling around the ring of `axis`: q, k, v (B, H, T/n, D) this device's tokens,
/// at the global positions `layout` gives it (sequence of global length T); -> (B, H, T/n, D).
/// Each step starts the transfer of the key/value block in hand to the next device
/// (asynchronous ppermute) and attends to it meanwhile (attention_block), folding the parts
/// with the online softmax (attention_merge). The backward pass runs the ring again from the
/// saved output and log-sum-exp: each block's key and value gradients travel with it and
/// come home after n hops, also overlapped with the attention of the block in hand. Equal to
/// attention over the gathered sequence (f32 sums in another order). scale 0: D^-0.5.
/// `overlap` false completes each transfer before the attention of the block in hand (the
/// same values; what the overlap hides is measured against it: bench_cp).
Tensor ring_attention(spmd::DeviceContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                      const mesh::Axes& axis, const ContextLayout& layout, bool causal = true,
                      float scale = 0.f, bool overlap = true);

/// The same attention by Ulysses' re-split: an all_to_all trades the sequence split for a
/// split of the heads (each device then holds the whole sequence of H/n heads), the
/// sequence is put in order, attended to as one block, and traded back. Heads must divide
/// by n (InvalidArgument naming them).
Tensor ulysses_attention(spmd::DeviceContext& ctx, const Tensor& q, const Tensor& k,
                         const Tensor& v, const mesh::Axes& axis, const ContextLayout& layout,
                         bool causal = true, float scale = 0.f);

/// tensor::attention_packed's attention across the split of `plan` (active): qkv
/// (B, T/n, 3 H D) read as attention_packed reads it (per position and head its q, k and v
/// rows side by side) -> (B, T/n, H D) f32, this device's positions, by plan.method. The
/// products run in f32 (more precise than a bf16 policy asks).
Tensor context_attention_packed(spmd::DeviceContext& ctx, const Tensor& qkv,
                                std::int64_t num_heads, bool causal, const ContextPlan& plan);

/// `drop` for an activation (B, T/n, ...) holding this device's positions under `plan`: each of
/// its chunks draws its block of the whole sequence's mask (nn::Dropout::sequence_starts), so
/// the split run drops what one device would with the same key. `drop` itself when the plan
/// is inactive.
nn::Dropout context_dropout(nn::Dropout drop, const spmd::DeviceContext* ctx,
                            const ContextPlan& plan, std::int64_t local_t);

/// The (query, key) pairs device `rank`'s queries see under a causal mask (all pairs
/// without one) over a sequence of length t: the attention's work on that device, in
/// multiples of 4 B H D flops forward. What the balanced layout evens out.
std::int64_t context_attention_pairs(const ContextLayout& layout, int rank, std::int64_t t,
                                     bool causal = true);

}  // namespace distjax::parallel
