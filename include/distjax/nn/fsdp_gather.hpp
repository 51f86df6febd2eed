// Gathering fully sharded parameters (ZeRO-3 / FSDP) on use, with prefetch: the gathers
// of the next parameters issued ahead of their use (non-blocking all_gather) so they
// travel while the current module computes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "distjax/comm/request.hpp"
#include "distjax/tensor/tensor.hpp"

namespace distjax::spmd {
class DeviceContext;
}

namespace distjax::nn {

using tensor::Tensor;

/// The parameter whose shard is `shard`, gathered over `axis` along `dim` (all_gather,
/// tiled): differentiable, its backward reduce-scatters the cotangent and divides it by
/// the axis size (the mean over the replicas that used the gathered value, as data
/// parallelism averages). The result varies over the shard's axes.
Tensor gather_fully_sharded(spmd::DeviceContext& ctx, const Tensor& shard, const std::string& axis,
                            int dim);

/// FSDP's prefetch, one per device (nn::FullySharded::prefetch points to it). During a pass
/// it records the order in which the device gathers its fully sharded parameters; in the
/// next pass, when the parameter at position i is gathered, the gathers of positions
/// i+1 .. i+depth of the recorded order are started (non-blocking all_gather), so each
/// travels while the modules before it compute, and gather() finds it done or in flight.
/// A pass starts with every Scope::fully_sharded call (one forward and its backward,
/// recomputations under remat included). Prefetched values are read from the shards'
/// storage at issue (optimizers update in place); a parameter whose storage or shape
/// changed since is gathered at use instead. Every device must run the same passes.
class FsdpPrefetcher {
 public:
  explicit FsdpPrefetcher(int depth = 2);
  ~FsdpPrefetcher();
  FsdpPrefetcher(const FsdpPrefetcher&) = delete;
  FsdpPrefetcher& operator=(const FsdpPrefetcher&) = delete;

  /// Starts a pass: what is still in flight from the last one is completed and dropped.
  void begin_pass();
  /// gather_fully_sharded, served from a prefetch when one is in flight for this
  /// position, and starting the next ones.
  Tensor gather(spmd::DeviceContext& ctx, const std::string& path, const Tensor& shard,
                const std::string& axis, int dim);

  /// Gathers served from a prefetch, and done at use, since construction.
  std::int64_t hits() const { return hits_; }
  std::int64_t misses() const { return misses_; }

 private:
  struct Entry {
    std::string path;
    Tensor shard;  // the handle seen last pass (its storage is read by the prefetch)
    std::string axis;
    int dim = 0;
  };
  struct InFlight {
    std::string path;
    const void* storage = nullptr;
    Shape shape;
    Tensor blocks;  // (n, shard...) rank-major, filled by the all_gather
    comm::Request request;
  };
  void start(spmd::DeviceContext& ctx, std::size_t position);

  int depth_;
  std::vector<Entry> last_, current_;
  std::map<std::size_t, InFlight> in_flight_;  // by position in last_
  std::int64_t hits_ = 0, misses_ = 0;
};

}  // namespace distjax::nn
