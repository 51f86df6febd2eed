#include "distjax/core/prng.hpp"

#include <algorithm>
#include <cmath>

namespace distjax {
namespace {

constexpr std::uint32_t rotl(std::uint32_t x, int r) {
  return (x << r) | (x >> (32 - r));
}

// Domain tags keep split, fold_in and bit streams apart for one key.
constexpr std::uint32_t kSplitTag = 0x53504c54u;  // "SPLT"
constexpr std::uint32_t kFoldTag = 0x464f4c44u;   // "FOLD"

// Uniform in (0, 1), never exactly 0 or 1: 24 random bits centred in their bucket.
// (w's top 24 bits + 0.5) / 2^24, in (0, 1). The top word's value, 1 - 2^-25, has no float
// (it would round to 1, and a normal draw of it to infinity): it is the float below 1.
inline float open_unit(std::uint32_t w) {
  return std::min((static_cast<float>(w >> 8) + 0.5f) * (1.0f / 16777216.0f), 0x1.fffffep-1f);
}

// Inverse error function (M. Giles, "Approximating the erfinv function", single precision).
inline float erfinv(float x) {
  float w = -std::log((1.0f - x) * (1.0f + x));
  float p;
  if (w < 5.0f) {
    w -= 2.5f;
    p = 2.81022636e-08f;
    p = 3.43273939e-07f + p * w;
    p = -3.5233877e-06f + p * w;
    p = -4.39150654e-06f + p * w;
    p = 0.00021858087f + p * w;
    p = -0.00125372503f + p * w;
    p = -0.00417768164f + p * w;
    p = 0.246640727f + p * w;
    p = 1.50140941f + p * w;
  } else {
    w = std::sqrt(w) - 3.0f;
    p = -0.000200214257f;
    p = 0.000100950558f + p * w;
    p = 0.00134934322f + p * w;
    p = -0.00367342844f + p * w;
    p = 0.00573950773f + p * w;
    p = -0.0076224613f + p * w;
    p = 0.00943887047f + p * w;
    p = 1.00167406f + p * w;
    p = 2.83297682f + p * w;
  }
  return p * x;
}

}  // namespace

std::array<std::uint32_t, 2> threefry2x32(std::array<std::uint32_t, 2> key,
                                          std::array<std::uint32_t, 2> counter) {
  static constexpr int kRot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  const std::uint32_t ks[3] = {key[0], key[1], 0x1BD11BDAu ^ key[0] ^ key[1]};
  std::uint32_t x0 = counter[0] + ks[0];
  std::uint32_t x1 = counter[1] + ks[1];
  for (int block = 0; block < 5; ++block) {
    for (int r = 0; r < 4; ++r) {
      x0 += x1;
      x1 = rotl(x1, kRot[(block % 2) * 4 + r]) ^ x0;
    }
    x0 += ks[(block + 1) % 3];
    x1 += ks[(block + 2) % 3] + static_cast<std::uint32_t>(block + 1);
  }
  return {x0, x1};
}

std::vector<Key> Key::split(int n) const {
  std::vector<Key> out(n);
  for (int i = 0; i < n; ++i)
    out[i].words = threefry2x32(words, {kSplitTag, static_cast<std::uint32_t>(i)});
  return out;
}

std::array<Key, 2> Key::split2() const {
  auto v = split(2);
  return {v[0], v[1]};
}

Key Key::fold_in(std::uint64_t data) const {
  auto once = threefry2x32(words, {kFoldTag, static_cast<std::uint32_t>(data)});
  return Key{threefry2x32(once, {kFoldTag, static_cast<std::uint32_t>(data >> 32)})};
}

Key Key::fold_in(std::string_view name) const {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return fold_in(h);
}

std::array<std::uint32_t, 2> Key::bits(std::uint64_t index) const {
  return threefry2x32(words,
                      {static_cast<std::uint32_t>(index >> 32), static_cast<std::uint32_t>(index)});
}

// out[i] = f(word offset + i of the key's stream), one Threefry block per pair of stream
// words; the values depend on (key, offset + i) only, not on how the loop is split over
// threads or where a shard starts.
template <class T, class F>
void fill_from_stream(const Key& key, T* out, std::int64_t n, F f, std::int64_t offset = 0) {
  if (n <= 0) return;
  std::int64_t i = 0;
  if (offset % 2 != 0) {  // an odd start takes the second word of its block
    out[0] = f(key.bits(static_cast<std::uint64_t>(offset / 2))[1]);
    i = 1;
  }
  const std::int64_t first_block = (offset + i) / 2;
  const std::int64_t blocks = (n - i + 1) / 2;
#pragma omp parallel for if (parallel : n > 65536)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const auto w = key.bits(static_cast<std::uint64_t>(first_block + b));
    const std::int64_t at = i + 2 * b;
    out[at] = f(w[0]);
    if (at + 1 < n) out[at + 1] = f(w[1]);
  }
}

void random_uniform(const Key& key, float* out, std::int64_t n, float lo, float hi,
                    std::int64_t offset) {
  fill_from_stream(
      key, out, n,
      [=](std::uint32_t w) {
        return lo + (hi - lo) * (static_cast<float>(w >> 8) * (1.0f / 16777216.0f));
      },
      offset);
}

void random_normal(const Key& key, float* out, std::int64_t n, std::int64_t offset) {
  fill_from_stream(
      key, out, n,
      [](std::uint32_t w) { return std::sqrt(2.0f) * erfinv(2.0f * open_unit(w) - 1.0f); },
      offset);
}

void random_truncated_normal(const Key& key, float* out, std::int64_t n, std::int64_t offset) {
  // Map the uniform into [cdf(-2), cdf(2)] and invert; stddev of N(0,1) truncated to
  // [-2, 2] is 0.87962566..., divided out so the result has unit variance.
  const float lo = std::erf(-2.0f / std::sqrt(2.0f));
  const float hi = -lo;
  constexpr float kInvStd = 1.0f / 0.87962566103423978f;
  fill_from_stream(
      key, out, n,
      [=](std::uint32_t w) {
        return std::sqrt(2.0f) * erfinv(lo + (hi - lo) * open_unit(w)) * kInvStd;
      },
      offset);
}

void random_bernoulli(const Key& key, std::uint8_t* out, std::int64_t n, float p,
                      std::int64_t offset) {
  fill_from_stream(
      key, out, n, [=](std::uint32_t w) { return static_cast<std::uint8_t>(open_unit(w) < p); },
      offset);
}

}  // namespace distjax
