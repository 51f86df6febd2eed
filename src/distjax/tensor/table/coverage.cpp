// Kernel-table coverage: with DISTJAX_KERNEL_COVERAGE=<dir>, the CPU table (the CPU's and
// the checked device's kernels) is served through a copy whose every entry counts its
// calls before calling the kernel, and the process writes <dir>/kernels.<unique>.txt at exit:
// one line "<family>.<entry> <calls>" per non-null entry. tests/tensor/kernel_coverage.cmake
// sums the files of the op tests' runs and fails on an entry nothing called.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor::detail {

const KernelTable& cpu_kernel_table();  // tensor/cpu/table.cpp

namespace {

struct Entry {
  std::string name;
  std::atomic<std::uint64_t>* calls;
  bool present;
};

std::vector<Entry>& entries() {
  static std::vector<Entry> list;
  return list;
}

// The counting stand-in of one entry: M is the entry (a function-pointer member of a family).
template <auto M>
struct Counted;
template <class Family, class R, class... A, R (*Family::*M)(A...)>
struct Counted<M> {
  static inline R (*kernel)(A...) = nullptr;
  static inline std::atomic<std::uint64_t> calls{0};
  static R call(A... args) {
    calls.fetch_add(1, std::memory_order_relaxed);
    return kernel(args...);
  }
  // Points `counted`'s entry at the stand-in when `real` has the kernel.
  static void wrap(const Family& real, Family& counted, const char* name) {
    kernel = real.*M;
    entries().push_back({name, &calls, kernel != nullptr});
    if (kernel != nullptr) counted.*M = &call;
  }
};

// One family: a copy of the real one with its entries counted. `Family` holds nothing but
// the `n` entries listed (a member added to a family and not here fails to compile).
template <class Family, std::size_t n, class... Wraps>
const Family* counted_family(const Family* real, Wraps... wraps) {
  static_assert(sizeof(Family) == n * sizeof(void (*)()),
                "a kernel family gained or lost an entry: list it in table/coverage.cpp");
  if (real == nullptr) return nullptr;
  auto* counted = new Family(*real);  // lives as long as the process
  (wraps(*real, *counted), ...);
  return counted;
}

template <auto M>
auto entry(const char* name) {
  return [name](const auto& real, auto& counted) { Counted<M>::wrap(real, counted, name); };
}

void write_counts() {
  const char* dir = std::getenv("DISTJAX_KERNEL_COVERAGE");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // A file of its own (mkstemp): process ids come back within one ctest run.
  std::string path = std::string(dir) + "/kernels.XXXXXX.txt";
  const int fd = ::mkstemps(path.data(), 4);
  std::FILE* f = fd >= 0 ? ::fdopen(fd, "w") : nullptr;
  if (f == nullptr) {
    std::fprintf(stderr, "DISTJAX_KERNEL_COVERAGE: cannot write in %s\n", dir);
    return;
  }
  for (const Entry& e : entries())
    if (e.present)
      std::fprintf(f, "%s %llu\n", e.name.c_str(),
                   static_cast<unsigned long long>(e.calls->load(std::memory_order_relaxed)));
  std::fclose(f);
}

KernelTable make_counted(const KernelTable& t) {
  KernelTable c = t;
  c.copy = counted_family<CopyKernels, 5>(
      t.copy, entry<&CopyKernels::fill>("copy.fill"), entry<&CopyKernels::convert>("copy.convert"),
      entry<&CopyKernels::copy_2d>("copy.copy_2d"), entry<&CopyKernels::to_host>("copy.to_host"),
      entry<&CopyKernels::from_host>("copy.from_host"));
  c.update = counted_family<UpdateKernels, 11>(
      t.update, entry<&UpdateKernels::sgd>("update.sgd"),
      entry<&UpdateKernels::sgd_momentum>("update.sgd_momentum"),
      entry<&UpdateKernels::adam>("update.adam"),
      entry<&UpdateKernels::sgd_many>("update.sgd_many"),
      entry<&UpdateKernels::sgd_momentum_many>("update.sgd_momentum_many"),
      entry<&UpdateKernels::adam_many>("update.adam_many"),
      entry<&UpdateKernels::sum_squares>("update.sum_squares"),
      entry<&UpdateKernels::sum_squares_many>("update.sum_squares_many"),
      entry<&UpdateKernels::scale>("update.scale"),
      entry<&UpdateKernels::norm_and_clip_factor>("update.norm_and_clip_factor"),
      entry<&UpdateKernels::scale_by>("update.scale_by"));
  c.gather = counted_family<GatherKernels, 1>(
      t.gather, entry<&GatherKernels::gather_rows>("gather.gather_rows"));
  c.elementwise = counted_family<ElementwiseKernels, 5>(
      t.elementwise, entry<&ElementwiseKernels::unary>("elementwise.unary"),
      entry<&ElementwiseKernels::unary_bf16>("elementwise.unary_bf16"),
      entry<&ElementwiseKernels::unary_grad>("elementwise.unary_grad"),
      entry<&ElementwiseKernels::binary>("elementwise.binary"),
      entry<&ElementwiseKernels::select>("elementwise.select"));
  c.reduce = counted_family<ReduceKernels, 4>(
      t.reduce, entry<&ReduceKernels::reduce>("reduce.reduce"),
      entry<&ReduceKernels::max_grad_run>("reduce.max_grad_run"),
      entry<&ReduceKernels::max_grad_general>("reduce.max_grad_general"),
      entry<&ReduceKernels::argmax>("reduce.argmax"));
  c.shape = counted_family<ShapeKernels, 2>(t.shape, entry<&ShapeKernels::permute>("shape.permute"),
                                            entry<&ShapeKernels::broadcast>("shape.broadcast"));
  c.nn = counted_family<NnKernels, 15>(
      t.nn, entry<&NnKernels::softmax>("nn.softmax"),
      entry<&NnKernels::softmax_backward>("nn.softmax_backward"),
      entry<&NnKernels::layer_norm>("nn.layer_norm"),
      entry<&NnKernels::layer_norm_bf16>("nn.layer_norm_bf16"),
      entry<&NnKernels::layer_norm_backward>("nn.layer_norm_backward"),
      entry<&NnKernels::layer_norm_backward_bf16>("nn.layer_norm_backward_bf16"),
      entry<&NnKernels::rms_norm>("nn.rms_norm"),
      entry<&NnKernels::rms_norm_backward>("nn.rms_norm_backward"),
      entry<&NnKernels::find_bad_id>("nn.find_bad_id"),
      entry<&NnKernels::embedding>("nn.embedding"),
      entry<&NnKernels::embedding_backward>("nn.embedding_backward"),
      entry<&NnKernels::cross_entropy>("nn.cross_entropy"),
      entry<&NnKernels::cross_entropy_backward>("nn.cross_entropy_backward"),
      entry<&NnKernels::cross_entropy_with_grad>("nn.cross_entropy_with_grad"),
      entry<&NnKernels::dropout>("nn.dropout"));
  c.attention = counted_family<AttentionKernels, 6>(
      t.attention, entry<&AttentionKernels::forward>("attention.forward"),
      entry<&AttentionKernels::backward>("attention.backward"),
      entry<&AttentionKernels::merge>("attention.merge"),
      entry<&AttentionKernels::serves_bf16>("attention.serves_bf16"),
      entry<&AttentionKernels::forward_bf16>("attention.forward_bf16"),
      entry<&AttentionKernels::backward_bf16>("attention.backward_bf16"));
  c.gemm = counted_family<GemmKernels, 5>(
      t.gemm, entry<&GemmKernels::gemm>("gemm.gemm"),
      entry<&GemmKernels::epilogue_backward>("gemm.epilogue_backward"),
      entry<&GemmKernels::gemm_dgelu>("gemm.gemm_dgelu"),
      entry<&GemmKernels::gemm_bias_grad>("gemm.gemm_bias_grad"),
      entry<&GemmKernels::gemm_f32_strided>("gemm.gemm_f32_strided"));
  c.inplace = counted_family<InplaceKernels, 2>(t.inplace,
                                                entry<&InplaceKernels::add_f32>("inplace.add_f32"),
                                                entry<&InplaceKernels::scale>("inplace.scale"));
  c.shard = counted_family<ShardKernels, 6>(
      t.shard, entry<&ShardKernels::copy_box>("shard.copy_box"),
      entry<&ShardKernels::shard_ids>("shard.shard_ids"),
      entry<&ShardKernels::shard_one_hot>("shard.shard_one_hot"),
      entry<&ShardKernels::select_equal>("shard.select_equal"),
      entry<&ShardKernels::sum_squares_f64>("shard.sum_squares_f64"),
      entry<&ShardKernels::sum_squares_f64_many>("shard.sum_squares_f64_many"));
  c.memory = counted_family<MemoryKernels, 11>(
      t.memory, entry<&MemoryKernels::zero>("memory.zero"),
      entry<&MemoryKernels::reduce_ranks>("memory.reduce_ranks"),
      entry<&MemoryKernels::synchronize>("memory.synchronize"),
      entry<&MemoryKernels::event_record>("memory.event_record"),
      entry<&MemoryKernels::event_wait>("memory.event_wait"),
      entry<&MemoryKernels::event_done>("memory.event_done"),
      entry<&MemoryKernels::event_stream_wait>("memory.event_stream_wait"),
      entry<&MemoryKernels::event_release>("memory.event_release"),
      entry<&MemoryKernels::to_host_async>("memory.to_host_async"),
      entry<&MemoryKernels::host_alloc>("memory.host_alloc"),
      entry<&MemoryKernels::host_free>("memory.host_free"));
  c.moe = counted_family<MoeKernels, 8>(
      t.moe, entry<&MoeKernels::top_k>("moe.top_k"),
      entry<&MoeKernels::take_columns>("moe.take_columns"),
      entry<&MoeKernels::take_columns_backward>("moe.take_columns_backward"),
      entry<&MoeKernels::dispatch_plan>("moe.dispatch_plan"),
      entry<&MoeKernels::combine>("moe.combine"),
      entry<&MoeKernels::combine_backward>("moe.combine_backward"),
      entry<&MoeKernels::grouped_gemm>("moe.grouped_gemm"),
      entry<&MoeKernels::grouped_gemm_wgrad>("moe.grouped_gemm_wgrad"));
  std::atexit(write_counts);
  return c;
}

}  // namespace

const KernelTable* counted_cpu_kernel_table() {
  static const bool on = std::getenv("DISTJAX_KERNEL_COVERAGE") != nullptr;
  if (!on) return nullptr;
  static const KernelTable counted = make_counted(cpu_kernel_table());
  return &counted;
}

}  // namespace distjax::tensor::detail
