// Ring all-gather and reduce-scatter on ppermute_start / ppermute_done. The gradients come
// from the tape: a ring gather's backward is a ring reduce-scatter run by the transposes of
// its hops (and the other way round), asynchronous like the forward.
#include "distjax/parallel/tp_async.hpp"

#include <map>
#include <utility>

#include "distjax/core/error.hpp"
#include "distjax/spmd/collectives.hpp"
#include "distjax/tensor/elementwise.hpp"
#include "distjax/tensor/shape_ops.hpp"

namespace distjax::parallel {

namespace {

int mod(int i, int n) {
  return ((i % n) + n) % n;
}

}  // namespace

std::vector<int> ring_gather_sources(int index, int n, RingMode mode) {
  std::vector<int> s{mod(index, n)};
  if (mode == RingMode::Unidirectional) {
    for (int k = 1; k < n; ++k)
      s.push_back(mod(index - k, n));
    return s;
  }
  // From d-1 for n/2 hops, from d+1 for (n-1)/2, alternating, the d-1 side first.
  for (int k = 1; static_cast<int>(s.size()) < n; ++k) {
    s.push_back(mod(index - k, n));
    if (static_cast<int>(s.size()) < n) s.push_back(mod(index + k, n));
  }
  return s;
}

// ------------------------------------------------------------------------- gather

RingGather::RingGather(spmd::DeviceContext& ctx, const Tensor& x, const mesh::Axes& axis,
                       RingMode mode)
    : ctx_(&ctx), axis_(axis), n_(ctx.axis_size(axis)), index_(ctx.axis_index(axis)) {
  tensor::check_defined(x, "RingGather", "x");
  own_ = spmd::pvary(ctx, x, axis);
  up_.shift = 1;
  down_.shift = -1;
  if (mode == RingMode::Unidirectional) {
    up_.hops = n_ - 1;
  } else {
    up_.hops = n_ / 2;
    down_.hops = (n_ - 1) / 2;
  }
  // Both first hops leave now: they travel while the caller uses its own chunk.
  for (Direction* dir : {&up_, &down_})
    if (dir->hops > 0)
      dir->in_flight =
          spmd::ppermute_start(ctx, own_, axis, spmd::ring_permutation(n_, dir->shift));
}

RingGather::~RingGather() {
  // A hop in flight owns buffers a peer may still write into: complete it. Errors are
  // dropped here (a destructor must not throw; the peer's failure is reported there).
  for (Direction* dir : {&up_, &down_}) {
    if (!dir->in_flight.valid()) continue;
    try {
      spmd::ppermute_done(dir->in_flight);
    } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch)
    }
  }
}

RingChunk RingGather::advance(Direction& dir) {
  Tensor chunk = spmd::ppermute_done(dir.in_flight);
  ++dir.hops_done;
  // Pass it on before the caller computes with it.
  if (dir.hops_done < dir.hops)
    dir.in_flight =
        spmd::ppermute_start(*ctx_, chunk, axis_, spmd::ring_permutation(n_, dir.shift));
  return {chunk, mod(index_ - dir.shift * dir.hops_done, n_)};
}

RingChunk RingGather::next() {
  DISTJAX_CHECK(has_next(), InvalidArgument, "[RingGather] all ", n_, " chunks along ", axis_.str(),
                " were already taken");
  const int t = taken_++;
  if (t == 0) return {own_, index_};
  // Alternate d-1, d+1, ...; the d-1 side has the extra hop when n-1 is odd.
  const bool down = down_.hops_done < up_.hops_done && down_.hops_done < down_.hops;
  return advance(down ? down_ : up_);
}

std::vector<Tensor> async_gather(spmd::DeviceContext& ctx, const Tensor& x,
                                 const mesh::Axes& axis) {
  std::vector<Tensor> out;
  async_gather_apply(ctx, x, axis, [&](const Tensor& c, int) { out.push_back(c); });
  return out;
}

std::vector<Tensor> async_gather_bidirectional(spmd::DeviceContext& ctx, const Tensor& x,
                                               const mesh::Axes& axis) {
  std::vector<Tensor> out;
  async_gather_apply(
      ctx, x, axis, [&](const Tensor& c, int) { out.push_back(c); }, RingMode::Bidirectional);
  return out;
}

void async_gather_apply(spmd::DeviceContext& ctx, const Tensor& x, const mesh::Axes& axis,
                        const std::function<void(const Tensor& chunk, int source)>& fn,
                        RingMode mode) {
  RingGather ring(ctx, x, axis, mode);
  while (ring.has_next()) {
    RingChunk c = ring.next();
    fn(c.value, c.source);
  }
}

// ------------------------------------------------------------------------ scatter

namespace {

// Calls the user's partial(j) at most once per block and checks every result against the
// first; in Bidirectional mode it hands out halves and keeps the half not yet needed.
class Partials {
 public:
  Partials(const char* op, const std::function<Tensor(int)>& fn, bool halves)
      : op_(op), fn_(fn), halves_(halves) {}

  // Block j whole (halves_ false) or its half h (0: first floor(c/2) of the last dim).
  Tensor take(int j, int h = 0) {
    if (auto it = kept_.find({j, h}); it != kept_.end()) {
      Tensor t = std::move(it->second);
      kept_.erase(it);
      return t;
    }
    Tensor p = fn_(j);
    check(j, p);
    if (!halves_) return p;
    const std::int64_t c = p.size(-1);
    std::vector<Tensor> parts = tensor::split(p, {c / 2, c - c / 2}, -1);
    kept_[{j, 1 - h}] = parts[1 - h];
    return parts[h];
  }

 private:
  void check(int j, const Tensor& p) {
    DISTJAX_CHECK(p.defined(), InvalidArgument, "[", op_, "] partial ", j, " is undefined");
    if (!first_.defined()) {
      first_ = p;
      first_block_ = j;
      if (halves_)
        DISTJAX_CHECK(p.rank() >= 1 && p.size(-1) >= 2, InvalidArgument, "[", op_,
                      "] partials are split in two along their last dimension, which needs "
                      "size >= 2; got shape ",
                      to_string(p.shape()));
      return;
    }
    DISTJAX_CHECK(p.shape() == first_.shape() && p.dtype() == first_.dtype(), InvalidArgument, "[",
                  op_, "] every partial must have one shape and dtype: partial ", j, " is ",
                  to_string(p.shape()), " ", dtype_name(p.dtype()), ", partial ", first_block_,
                  " is ", to_string(first_.shape()), " ", dtype_name(first_.dtype()));
  }

  const char* op_;
  const std::function<Tensor(int)>& fn_;
  bool halves_;
  Tensor first_;
  int first_block_ = -1;
  std::map<std::pair<int, int>, Tensor> kept_;
};

// One direction of a ring reduce-scatter: the accumulator of block d + shift travels
// towards d - shift; hop k brings the one of block d + shift*(k+1), to which this device
// adds its partial; after n-1 hops it holds the sum of block d. `take(j)` gives this
// device's partial for block j.
struct ScatterRing {
  int shift;
  int half;
  Tensor acc;
  spmd::PermuteHandle in_flight;
};

Tensor scatter(spmd::DeviceContext& ctx, const std::function<Tensor(int)>& partial,
               const mesh::Axes& axis, RingMode mode, const char* op) {
  const int n = ctx.axis_size(axis);
  const int d = ctx.axis_index(axis);
  const bool bidi = mode == RingMode::Bidirectional;
  Partials parts(op, partial, bidi);
  // The first half goes towards d - 1 (as in the unidirectional ring), the second towards d + 1.
  std::vector<ScatterRing> rings;
  rings.push_back({.shift = 1, .half = 0, .acc = {}, .in_flight = {}});
  if (bidi) rings.push_back({.shift = -1, .half = 1, .acc = {}, .in_flight = {}});
  for (ScatterRing& r : rings)
    r.acc = spmd::pvary(ctx, parts.take(mod(d + r.shift, n), r.half), axis);
  for (int k = 1; k < n; ++k) {
    for (ScatterRing& r : rings)
      r.in_flight = spmd::ppermute_start(ctx, r.acc, axis, spmd::ring_permutation(n, -r.shift));
    // The partials (lazily computed) overlap the hops in flight.
    std::vector<Tensor> mine;
    for (ScatterRing& r : rings)
      mine.push_back(parts.take(mod(d + r.shift * (k + 1), n), r.half));
    for (std::size_t i = 0; i < rings.size(); ++i)
      rings[i].acc = tensor::add(spmd::ppermute_done(rings[i].in_flight), mine[i]);
  }
  if (!bidi) return rings[0].acc;
  return tensor::concat({rings[0].acc, rings[1].acc}, -1);
}

}  // namespace

Tensor async_scatter(spmd::DeviceContext& ctx, const std::function<Tensor(int block)>& partial,
                     const mesh::Axes& axis, RingMode mode) {
  return scatter(ctx, partial, axis, mode,
                 mode == RingMode::Bidirectional ? "async_scatter_bidirectional" : "async_scatter");
}

namespace {

std::function<Tensor(int)> from_vector(const char* op, const std::vector<Tensor>& partials,
                                       spmd::DeviceContext& ctx, const mesh::Axes& axis) {
  const int n = ctx.axis_size(axis);
  DISTJAX_CHECK(static_cast<int>(partials.size()) == n, InvalidArgument, "[", op, "] expected ", n,
                " partials (one per device along ", axis.str(), "), got ", partials.size());
  // Checked here, before any hop, so a bad argument fails on every device alike.
  for (int j = 0; j < n; ++j) {
    const Tensor& p = partials[j];
    DISTJAX_CHECK(p.defined(), InvalidArgument, "[", op, "] partial ", j, " is undefined");
    DISTJAX_CHECK(p.shape() == partials[0].shape() && p.dtype() == partials[0].dtype(),
                  InvalidArgument, "[", op,
                  "] every partial must have one shape and dtype: "
                  "partial ",
                  j, " is ", to_string(p.shape()), " ", dtype_name(p.dtype()), ", partial 0 is ",
                  to_string(partials[0].shape()), " ", dtype_name(partials[0].dtype()));
  }
  return [&partials](int j) { return partials[j]; };
}

}  // namespace

Tensor async_scatter(spmd::DeviceContext& ctx, const std::vector<Tensor>& partials,
                     const mesh::Axes& axis) {
  return scatter(ctx, from_vector("async_scatter", partials, ctx, axis), axis,
                 RingMode::Unidirectional, "async_scatter");
}

Tensor async_scatter_bidirectional(spmd::DeviceContext& ctx, const std::vector<Tensor>& partials,
                                   const mesh::Axes& axis) {
  return scatter(ctx, from_vector("async_scatter_bidirectional", partials, ctx, axis), axis,
                 RingMode::Bidirectional, "async_scatter_bidirectional");
}

}  // namespace distjax::parallel
