// Counter-based PRNG keys (Threefry-2x32, 20 rounds, as in JAX): `split` and `fold_in`
// derive independent keys; the same key gives the same numbers on every run and platform.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace distjax {

/// A PRNG key: two 32-bit words. Keys are values; using a key twice gives the same bits.
///
///   Key k = Key::from_seed(0);
///   auto [k1, k2] = k.split2();
///   Key per_layer = k.fold_in(3);
struct Key {
  std::array<std::uint32_t, 2> words{0, 0};

  static Key from_seed(std::uint64_t seed) {
    return Key{{static_cast<std::uint32_t>(seed >> 32), static_cast<std::uint32_t>(seed)}};
  }
  /// n new keys, independent of each other and of this key.
  std::vector<Key> split(int n) const;
  std::array<Key, 2> split2() const;
  /// A new key that mixes `data` into this one (devices, steps, layer indices).
  Key fold_in(std::uint64_t data) const;
  /// fold_in of a stable 64-bit hash (FNV-1a) of a name, e.g. a parameter path.
  Key fold_in(std::string_view name) const;
  /// The `index`-th pair of random words of this key's stream.
  std::array<std::uint32_t, 2> bits(std::uint64_t index) const;

  friend bool operator==(const Key&, const Key&) = default;
};

/// Threefry-2x32 with 20 rounds applied to counter (c0, c1) under key (k0, k1).
std::array<std::uint32_t, 2> threefry2x32(std::array<std::uint32_t, 2> key,
                                          std::array<std::uint32_t, 2> counter);

// Element i of a key's stream depends on (key, i) only. The fills below write elements
// [offset, offset + n) of the stream into out[0..n): a shard of a parameter is generated
// directly from its global element indices, equal to that slice of the whole draw.

/// Fills `out[0..n)` with uniform floats in [lo, hi) from the key's stream.
void random_uniform(const Key& key, float* out, std::int64_t n, float lo = 0.f, float hi = 1.f,
                    std::int64_t offset = 0);
/// Fills `out[0..n)` with standard-normal floats (inverse-CDF, so element i depends on i only).
void random_normal(const Key& key, float* out, std::int64_t n, std::int64_t offset = 0);
/// Standard normal truncated to [-2, 2], rescaled to unit variance (Flax's truncated_normal).
void random_truncated_normal(const Key& key, float* out, std::int64_t n, std::int64_t offset = 0);
/// Fills `out[0..n)` with Bernoulli(p) as 0/1 bytes.
void random_bernoulli(const Key& key, std::uint8_t* out, std::int64_t n, float p,
                      std::int64_t offset = 0);

}  // namespace distjax
