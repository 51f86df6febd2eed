// cuDNN's fused attention for the CUDA attention family's bf16 entries (see
// attention_cudnn.hpp). Built where CMake found the cuDNN frontend's headers
// (scripts/fetch-cudnn-frontend.sh) and cudnn.h; otherwise every plan runs the own kernels
// and status() says why.
//
// One graph per problem and direction (forward: o and the row log-sum-exp, cuDNN's
// "stats"; backward: dq, dk, dv from q, k, v, o, lse and do), built on first use and kept
// for the process, with one cuDNN handle per GPU. cuDNN's stats are the log-sum-exp of the
// scaled scores, the family's lse, so the two implementations share the saved tensors'
// meaning. The backward asks for cuDNN's deterministic algorithm (a fixed summation order,
// as the own kernels have) and takes the other where a cuDNN refuses it; with
// DISTJAX_CUDA_ATTENTION_DETERMINISTIC=0 it takes cuDNN's default (dQ summed with atomics,
// as PyTorch's and JAX's fused attention do by default: faster, its bits vary run to run).
// status() says which ran. Calls hold one process-wide lock: each only enqueues work on the
// caller's stream.
#include "distjax/tensor/cuda/attention_cudnn.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "distjax/core/error.hpp"
#include "distjax/tensor/cuda.hpp"

#if DISTJAX_HAVE_CUDNN_FRONTEND

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "distjax/tensor/cuda_runtime.hpp"

// The frontend's dynamic loading reads cuDNN's symbols from this handle (set once loaded).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace distjax::tensor::cuda::cudnn_attention {
namespace {

namespace fe = cudnn_frontend;
using detail::AttentionPlan;

enum class Mode { Auto, Cudnn, Own };

Mode mode() {
  const char* v = std::getenv("DISTJAX_CUDA_ATTENTION");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return Mode::Auto;
  if (std::strcmp(v, "cudnn") == 0) return Mode::Cudnn;
  // "f32" also keeps the own kernels on f32 (attention_mma.cu).
  if (std::strcmp(v, "own") == 0 || std::strcmp(v, "f32") == 0) return Mode::Own;
  DISTJAX_THROW(ConfigError, "[attention] DISTJAX_CUDA_ATTENTION=", v,
                " is not one of auto, cudnn, own, f32");
}

// The loaded library: its handle, or why there is none.
struct Library {
  void* handle = nullptr;
  std::string why;
  std::size_t version = 0;
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    std::vector<std::string> names;
    if (const char* p = std::getenv("DISTJAX_CUDNN_LIBRARY"); p != nullptr && *p != '\0')
      names.emplace_back(p);
    names.emplace_back("libcudnn.so.9");
#ifdef DISTJAX_CUDNN_HINT_DIR
    names.emplace_back(std::string(DISTJAX_CUDNN_HINT_DIR) + "/libcudnn.so.9");
#endif
    std::string tried;
    for (const std::string& n : names) {
      l.handle = dlopen(n.c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (l.handle != nullptr) break;
      const char* e = dlerror();
      tried += (tried.empty() ? "" : "; ") + (e ? std::string(e) : n);
    }
    if (l.handle == nullptr) {
      l.why = "cuDNN not loaded (" + tried + "; set DISTJAX_CUDNN_LIBRARY)";
      return l;
    }
    fe::cudnn_dlhandle = l.handle;
    // The frontend loads the CUDA runtime too, trying libcudart.so.12 before .so.13: point it
    // at this build's (a user's choice stays).
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME",
           ("libcudart.so." + std::to_string(CUDART_VERSION / 1000)).c_str(), /*overwrite=*/0);
    try {
      l.version = fe::detail::get_backend_version();
    } catch (const std::exception& e) {
      l.why = std::string("cuDNN loaded, but not usable: ") + e.what();
      l.handle = nullptr;
      return l;
    }
    if (l.version < 90000) {
      l.why = "cuDNN " + std::to_string(l.version) + " is older than 9.0";
      l.handle = nullptr;
    }
    return l;
  }();
  return lib;
}

// Operand ids in the graphs' variant packs.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// The problem a graph computes: the plan without its pointers.
using Key = std::tuple<bool /*backward*/, int /*device*/, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, bool, std::uint32_t>;

Key key_of(const AttentionPlan& a, bool backward, int device) {
  std::uint32_t scale_bits;
  std::memcpy(&scale_bits, &a.scale, 4);
  return {backward, device, a.bh,  a.t,    a.s,    a.d,   a.ldq, a.ldkv,   a.ldo,
          a.heads,  a.q_b,  a.q_h, a.kv_b, a.kv_h, a.o_b, a.o_h, a.causal, scale_bits};
}

struct Graph {
  std::shared_ptr<fe::graph::Graph> graph;  // null where cuDNN refused the problem
  std::int64_t workspace = 0;
  bool deterministic = true;
  std::string why;  // why not, where graph is null
};

struct State {
  std::mutex mu;
  std::map<int, cudnnHandle_t> handles;  // per CUDA device, never destroyed
  std::map<Key, Graph> graphs;
  std::atomic<std::int64_t> forward_calls{0}, backward_calls{0};
  bool any_nondeterministic = false;
};

State& state() {
  static State* s = new State();  // outlives the static destructors that may still run attention
  return *s;
}

int current_device() {
  int d = 0;
  DISTJAX_CUDA_CHECK(cudaGetDevice(&d), "attention");
  return d;
}

cudnnHandle_t handle_for(State& st, int device) {
  auto it = st.handles.find(device);
  if (it != st.handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t rc = fe::detail::create_handle(&h);
  DISTJAX_CHECK(rc == CUDNN_STATUS_SUCCESS, Error,
                "[attention] cudnnCreate failed on cuda:", device, ": ",
                fe::detail::get_error_string(rc));
  st.handles.emplace(device, h);
  return h;
}

// dims and strides of an operand of the plan: (B, H, rows, D) at (x_b, x_h, ld, 1).
struct Layout {
  std::vector<std::int64_t> dim, stride;
};
Layout layout(const AttentionPlan& a, std::int64_t rows, std::int64_t ld, std::int64_t xb,
              std::int64_t xh) {
  const std::int64_t b = a.bh / a.heads, h = a.heads;
  // A one-head layout (heads == 1) has x_h == 0: any stride serves a dimension of size 1.
  return {{b, h, rows, a.d}, {xb, h == 1 ? xb : xh, ld, 1}};
}

std::shared_ptr<fe::graph::Tensor_attributes> operand(fe::graph::Graph& g, const char* name,
                                                      Uid uid, const Layout& l) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(l.dim).set_stride(
          l.stride));
}

Layout stats_layout(const AttentionPlan& a) {
  const std::int64_t b = a.bh / a.heads, h = a.heads;
  return {{b, h, a.t, 1}, {h * a.t, a.t, 1, 1}};
}

// Builds the graph of one direction; returns the error text, empty when it built.
std::string build(Graph& out, const AttentionPlan& a, bool backward, cudnnHandle_t h,
                  bool deterministic) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const Layout lq = layout(a, a.t, a.ldq, a.q_b, a.q_h),
               lkv = layout(a, a.s, a.ldkv, a.kv_b, a.kv_h),
               lo = layout(a, a.t, a.ldo, a.o_b, a.o_h), ls = stats_layout(a);
  auto q = operand(*g, "q", kQ, lq), k = operand(*g, "k", kK, lkv), v = operand(*g, "v", kV, lkv);
  if (!backward) {
    auto opts = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true);
    opts.set_attn_scale(a.scale);
    if (a.causal) opts.set_causal_mask(true);
    auto [o, stats] = g->sdpa(q, k, v, opts);
    o->set_output(true).set_uid(kO).set_dim(lo.dim).set_stride(lo.stride);
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
    stats->set_dim(ls.dim).set_stride(ls.stride);
  } else {
    auto o = operand(*g, "o", kO, lo), go = operand(*g, "do", kDO, lo);
    auto stats = operand(*g, "stats", kStats, ls);
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto opts = fe::graph::SDPA_backward_attributes().set_name("attention_backward");
    opts.set_attn_scale(a.scale).set_deterministic_algorithm(deterministic);
    if (a.causal) opts.set_causal_mask(true);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, go, stats, opts);
    dq->set_output(true).set_uid(kDQ).set_dim(lq.dim).set_stride(lq.stride);
    dk->set_output(true).set_uid(kDK).set_dim(lkv.dim).set_stride(lkv.stride);
    dv->set_output(true).set_uid(kDV).set_dim(lkv.dim).set_stride(lkv.stride);
  }
  auto step = [](fe::error_t e, const char* what) -> std::string {
    return e.is_good() ? std::string() : std::string(what) + ": " + e.get_message();
  };
  std::string err;
  if (err.empty()) err = step(g->validate(), "validate");
  if (err.empty()) err = step(g->build_operation_graph(h), "build_operation_graph");
  if (err.empty())
    err = step(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  if (err.empty()) err = step(g->check_support(h), "check_support");
  if (err.empty()) err = step(g->build_plans(h), "build_plans");
  std::int64_t ws = 0;
  if (err.empty()) err = step(g->get_workspace_size(ws), "get_workspace_size");
  if (!err.empty()) return err;
  out.graph = std::move(g);
  out.workspace = ws;
  out.deterministic = deterministic;
  return {};
}

std::string describe(const AttentionPlan& a) {
  return "bh " + std::to_string(a.bh) + ", T " + std::to_string(a.t) + ", S " +
         std::to_string(a.s) + ", D " + std::to_string(a.d) + (a.causal ? ", causal" : "");
}

// Whether the backward asks for the deterministic algorithm: DISTJAX_CUDA_ATTENTION_DETERMINISTIC
// unset or 1 (the default), 0 for cuDNN's default, read once.
bool want_deterministic() {
  static const bool want = [] {
    const char* v = std::getenv("DISTJAX_CUDA_ATTENTION_DETERMINISTIC");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "1") == 0) return true;
    if (std::strcmp(v, "0") == 0) return false;
    DISTJAX_THROW(ConfigError, "[attention] DISTJAX_CUDA_ATTENTION_DETERMINISTIC=", v,
                  " is not 0 or 1");
  }();
  return want;
}

// The graph of (a, direction) on the current device, built on first use (under st.mu).
const Graph& graph_for(State& st, const AttentionPlan& a, bool backward, int device) {
  const Key key = key_of(a, backward, device);
  auto it = st.graphs.find(key);
  if (it != st.graphs.end()) return it->second;
  Graph g;
  try {
    const cudnnHandle_t h = handle_for(st, device);
    const bool deterministic = !backward || want_deterministic();
    std::string err = build(g, a, backward, h, deterministic);
    if (!err.empty() && backward && deterministic) {  // no deterministic backward for it
      const std::string det_err = err;
      err = build(g, a, backward, h, false);
      if (!err.empty()) err = det_err + "; without the deterministic algorithm: " + err;
    }
    if (!err.empty()) g.why = std::string(backward ? "backward" : "forward") + " " + err;
  } catch (const std::exception& e) {
    g.graph.reset();
    g.why = e.what();
  }
  if (g.graph && !g.deterministic) st.any_nondeterministic = true;
  return st.graphs.emplace(key, std::move(g)).first->second;
}

// Shape checks cuDNN's SDPA makes, made here first so the answer comes without a build.
std::string shape_refusal(const AttentionPlan& a) {
  if (!a.bf16_products) return "not a bf16 plan";
  if (a.bh <= 0 || a.t <= 0 || a.s <= 0) return "an empty problem";
  if (a.d % 8 != 0 || a.d > 128) return "head size " + std::to_string(a.d) + " (8, 16, ..., 128)";
  if (a.causal && a.t != a.s) return "a causal mask with T != S";
  if (a.segments != nullptr) return "document ids (its graphs take no segment mask here)";
  if (a.q_pos != nullptr) return "global positions (a block of a longer sequence)";
  for (std::int64_t x : {a.ldq, a.ldkv, a.ldo, a.q_b, a.q_h, a.kv_b, a.kv_h, a.o_b, a.o_h})
    if (x % 8 != 0) return "strides that are not multiples of 8 elements";
  return {};
}

void run(const AttentionPlan& a, bool backward, std::unordered_map<std::int64_t, void*>& pack) {
  State& st = state();
  const cudaStream_t stream = cudaStreamPerThread;
  const char* op = backward ? "attention_backward" : "attention";
  std::lock_guard lk(st.mu);
  const int device = current_device();
  const Graph& g = graph_for(st, a, backward, device);
  DISTJAX_CHECK(g.graph != nullptr, Error, "[", op, "] cuDNN cannot run ", describe(a), ": ",
                g.why);
  const cudnnHandle_t h = handle_for(st, device);
  const cudnnStatus_t rc = fe::detail::set_stream(h, stream);
  DISTJAX_CHECK(rc == CUDNN_STATUS_SUCCESS, Error, "[", op,
                "] cudnnSetStream failed: ", fe::detail::get_error_string(rc));
  void* workspace = nullptr;
  if (g.workspace > 0)
    DISTJAX_CUDA_CHECK(cudaMallocAsync(&workspace, static_cast<std::size_t>(g.workspace), stream),
                       op, "cuDNN workspace of ", g.workspace, " bytes");
  fe::error_t e = g.graph->execute(h, pack, workspace);
  if (workspace != nullptr) DISTJAX_CUDA_CHECK(cudaFreeAsync(workspace, stream), op);
  DISTJAX_CHECK(e.is_good(), Error, "[", op, "] cuDNN's execute failed for ", describe(a), ": ",
                e.get_message());
  (backward ? st.backward_calls : st.forward_calls).fetch_add(1, std::memory_order_relaxed);
}

void* ptr(const void* p) {
  return const_cast<void*>(p);
}

}  // namespace

bool serves(const AttentionPlan& a) {
  const Mode m = mode();
  if (m == Mode::Own || !a.bf16_products) return false;
  std::string why = shape_refusal(a);
  if (why.empty() && library().handle == nullptr) why = library().why;
  if (why.empty()) {
    State& st = state();
    std::lock_guard lk(st.mu);
    const int device = current_device();
    const Graph& f = graph_for(st, a, false, device);
    const Graph& b = graph_for(st, a, true, device);
    why = f.graph == nullptr ? f.why : b.graph == nullptr ? b.why : std::string();
  }
  if (why.empty()) return true;
  DISTJAX_CHECK(m != Mode::Cudnn, NotImplemented, "[attention] DISTJAX_CUDA_ATTENTION=cudnn, but ",
                "cuDNN's attention cannot run ", describe(a), ": ", why);
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "[attention] the own bf16 kernels run (%s): %s\n", describe(a).c_str(),
                 why.c_str());
  });
  return false;
}

void forward(const AttentionPlan& a, const bf16* q, const bf16* k, const bf16* v, bf16* o,
             float* lse) {
  std::unordered_map<std::int64_t, void*> pack{
      {kQ, ptr(q)}, {kK, ptr(k)}, {kV, ptr(v)}, {kO, o}, {kStats, lse}};
  run(a, false, pack);
}

void backward(const AttentionPlan& a, const bf16* q, const bf16* k, const bf16* v, const bf16* o,
              const float* lse, const bf16* go, bf16* dq, bf16* dk, bf16* dv) {
  std::unordered_map<std::int64_t, void*> pack{{kQ, ptr(q)}, {kK, ptr(k)},       {kV, ptr(v)},
                                               {kO, ptr(o)}, {kStats, ptr(lse)}, {kDO, ptr(go)},
                                               {kDQ, dq},    {kDK, dk},          {kDV, dv}};
  run(a, true, pack);
}

std::string status() {
  if (mode() == Mode::Own)
    return std::string("turned off (DISTJAX_CUDA_ATTENTION=") +
           std::getenv("DISTJAX_CUDA_ATTENTION") + ")";
  const Library& l = library();
  if (l.handle == nullptr) return l.why;
  const std::size_t v = l.version;
  std::string s = "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
                  std::to_string(v % 100) + " through the cuDNN frontend " +
                  std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
                  std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
                  std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
  State& st = state();
  std::lock_guard lk(st.mu);
  return s + (st.any_nondeterministic ? " (a backward is not deterministic)"
              : want_deterministic()  ? ""
                                      : " (DISTJAX_CUDA_ATTENTION_DETERMINISTIC=0)");
}

Calls calls() {
  const State& st = state();
  return {st.forward_calls.load(), st.backward_calls.load()};
}

}  // namespace distjax::tensor::cuda::cudnn_attention

#else  // no cuDNN frontend in this build

namespace distjax::tensor::cuda::cudnn_attention {

namespace {
const char* kWhy =
    "this build has no cuDNN attention (CMake found no cuDNN frontend headers or cudnn.h; run "
    "scripts/fetch-cudnn-frontend.sh and reconfigure)";
}

bool serves(const detail::AttentionPlan& a) {
  const char* v = std::getenv("DISTJAX_CUDA_ATTENTION");
  DISTJAX_CHECK(!(a.bf16_products && v != nullptr && std::strcmp(v, "cudnn") == 0), NotImplemented,
                "[attention] DISTJAX_CUDA_ATTENTION=cudnn, but ", kWhy);
  return false;
}

void forward(const detail::AttentionPlan&, const bf16*, const bf16*, const bf16*, bf16*, float*) {
  DISTJAX_THROW(NotImplemented, "[attention] ", kWhy);
}

void backward(const detail::AttentionPlan&, const bf16*, const bf16*, const bf16*, const bf16*,
              const float*, const bf16*, bf16*, bf16*, bf16*) {
  DISTJAX_THROW(NotImplemented, "[attention_backward] ", kWhy);
}

std::string status() {
  return kWhy;
}

Calls calls() {
  return {};
}

}  // namespace distjax::tensor::cuda::cudnn_attention

#endif

namespace distjax::tensor {

std::string cuda_attention_library() {
  return cuda::cudnn_attention::status();
}

CudnnAttentionCalls cuda_attention_cudnn_calls() {
  const cuda::cudnn_attention::Calls c = cuda::cudnn_attention::calls();
  return {c.forward, c.backward};
}

}  // namespace distjax::tensor
