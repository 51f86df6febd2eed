// Fixed sinusoidal position encodings ("Attention is all you need").
#pragma once

#include <cstdint>

#include "distjax/tensor/tensor.hpp"

namespace distjax::nn {

/// pe[t, 2i] = sin(t / 10000^(2i / C)), pe[t, 2i + 1] = cos(t / 10000^(2i / C)).
///  Returns (T, C) f32, a constant (no parameters, not on the tape).
tensor::Tensor sinusoidal_positions(std::int64_t seq_len, std::int64_t channels);

}  // namespace distjax::nn
