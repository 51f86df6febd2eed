// Rank-major communicator buffers and tensor dimensions: a gathered (n, block...) buffer
// as a dimension of the result, and back (the collectives' layout, public for the code
// that gathers through a communicator itself, as the FSDP gather does).
#pragma once

#include <vector>

#include "distjax/tensor/shape_ops.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::spmd {


// (n, block...) in rank-major order -> the block axis moved to position `dim` of the
// result, and merged with the block's dimension `dim` when tiled.
inline tensor::Tensor blocks_to_dim(const tensor::Tensor& blocks, int dim, bool tiled) {
  const int r = blocks.rank() - 1;  // rank of one block
  tensor::Tensor t = blocks;
  if (dim != 0) {
    std::vector<int> perm;
    for (int i = 1; i <= dim; ++i)
      perm.push_back(i);
    perm.push_back(0);
    for (int i = dim + 1; i <= r; ++i)
      perm.push_back(i);
    t = tensor::permute(blocks, perm);
  }
  if (!tiled) return t;
  Shape s = t.shape();  // (.., n, S, ..) with n at `dim`
  s[dim] *= s[dim + 1];
  s.erase(s.begin() + dim + 1);
  return t.view(s);
}

// Inverse of blocks_to_dim: x's dimension `dim` (n*S when tiled, n when not) becomes a
// leading block axis of n, contiguous, ready for a rank-major communicator buffer.
inline tensor::Tensor dim_to_blocks(const tensor::Tensor& x, int dim, int n, bool tiled) {
  tensor::Tensor t = x;
  if (tiled) {
    Shape v = x.shape();
    v[dim] /= n;
    v.insert(v.begin() + dim, n);
    t = x.view(v);
  }
  if (dim == 0) return t;
  std::vector<int> perm{dim};
  for (int i = 0; i < t.rank(); ++i)
    if (i != dim) perm.push_back(i);
  return tensor::permute(t, perm);
}

}  // namespace distjax::spmd
