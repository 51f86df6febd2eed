#include "distjax/data/synthetic.hpp"

#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/data/detail/on_device.hpp"
#include "distjax/data/loader.hpp"

namespace distjax::data {

ArrayDataset synthetic_classification(std::int64_t n, std::int64_t features, std::int64_t classes,
                                      const Key& key) {
  DISTJAX_CHECK(n >= 1 && features >= 1 && classes >= 2, InvalidArgument,
                "[synthetic_classification] need n >= 1, features >= 1, classes >= 2; got ", n,
                ", ", features, ", ", classes);
  auto keys = key.split(2);
  // Made on the host, then handed to the current device with one copy each.
  ArrayDataset d;
  d.inputs = Tensor::empty({n, features}, DType::F32, Device::cpu());
  d.labels = Tensor::empty({n}, DType::I32, Device::cpu());
  float* x = d.inputs.data<float>();
  random_normal(keys[0], x, n * features);
  std::vector<float> w(static_cast<std::size_t>(features * classes));
  random_normal(keys[1], w.data(), features * classes);
  std::int32_t* y = d.labels.data<std::int32_t>();
  std::vector<double> logits(static_cast<std::size_t>(classes));
  for (std::int64_t i = 0; i < n; ++i) {
    std::fill(logits.begin(), logits.end(), 0.0);
    for (std::int64_t f = 0; f < features; ++f)
      for (std::int64_t c = 0; c < classes; ++c)
        logits[c] += static_cast<double>(x[i * features + f]) * w[f * classes + c];
    std::int64_t best = 0;
    for (std::int64_t c = 1; c < classes; ++c)
      if (logits[c] > logits[best]) best = c;
    y[i] = static_cast<std::int32_t>(best);
  }
  return on_current_device(std::move(d));
}

ArrayDataset synthetic_tokens(std::int64_t n, std::int64_t seq_len, std::int64_t vocab,
                              const Key& key) {
  DISTJAX_CHECK(n >= 1 && seq_len >= 1 && vocab >= 2, InvalidArgument,
                "[synthetic_tokens] need n >= 1, seq_len >= 1, vocab >= 2; got ", n, ", ", seq_len,
                ", ", vocab);
  auto keys = key.split(2);
  const std::vector<std::int64_t> perm = random_permutation(vocab, keys[0]);
  ArrayDataset d;
  d.inputs = Tensor::empty({n, seq_len}, DType::I32, Device::cpu());
  d.labels = Tensor::empty({n, seq_len}, DType::I32, Device::cpu());
  std::int32_t* x = d.inputs.data<std::int32_t>();
  std::int32_t* y = d.labels.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    auto w = keys[1].bits(static_cast<std::uint64_t>(i));
    std::int64_t tok = static_cast<std::int64_t>(w[0] % static_cast<std::uint32_t>(vocab));
    for (std::int64_t t = 0; t < seq_len; ++t) {
      x[i * seq_len + t] = static_cast<std::int32_t>(tok);
      tok = perm[tok];
      y[i * seq_len + t] = static_cast<std::int32_t>(tok);
    }
  }
  return on_current_device(std::move(d));
}

}  // namespace distjax::data
