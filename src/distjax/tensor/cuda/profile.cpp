// Per-op device time of the CUDA backend (profile_ops_begin / profile_ops_end in
// tensor/cuda.hpp): each profiled dispatch records an event before and after its kernels
// on the calling thread's stream; the end of profiling waits for the events and sums their
// intervals per op name.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "distjax/tensor/cuda.hpp"
#include "distjax/tensor/cuda_runtime.hpp"
#include "distjax/tensor/table/table.hpp"

namespace distjax::tensor {
namespace {

struct Record {
  const char* op;
  cudaEvent_t start, end;
};

// Every thread's records (a thread may end before profiling does).
std::mutex records_mu;
std::vector<Record>& records() {
  static std::vector<Record> r;
  return r;
}

// The open dispatches of this thread, innermost last.
thread_local std::vector<Record> open_records;

}  // namespace

void profile_ops_begin() {
  std::lock_guard<std::mutex> lock(records_mu);
  records().clear();
  detail::op_profiling.store(true);
}

std::vector<OpTime> profile_ops_end() {
  detail::op_profiling.store(false);
  std::lock_guard<std::mutex> lock(records_mu);
  std::map<std::string, OpTime> by_op;
  for (const Record& r : records()) {
    DISTJAX_CUDA_CHECK(cudaEventSynchronize(r.end), "profile_ops_end");
    float ms = 0;
    DISTJAX_CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.end), "profile_ops_end");
    OpTime& t = by_op[r.op];
    t.op = r.op;
    t.ms += ms;
    ++t.calls;
    cudaEventDestroy(r.start);
    cudaEventDestroy(r.end);
  }
  records().clear();
  std::vector<OpTime> out;
  for (auto& [name, t] : by_op) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return out;
}

namespace detail {

void cuda_profile_begin(const char* op) {
  Record r{op, nullptr, nullptr};
  DISTJAX_CUDA_CHECK(cudaEventCreate(&r.start), op, "profiling");
  DISTJAX_CUDA_CHECK(cudaEventCreate(&r.end), op, "profiling");
  DISTJAX_CUDA_CHECK(cudaEventRecord(r.start, cudaStreamPerThread), op, "profiling");
  open_records.push_back(r);
}

void cuda_profile_end() {
  if (open_records.empty()) return;
  Record r = open_records.back();
  open_records.pop_back();
  // A destructor calls this: a failure here is reported by the next checked call.
  cudaEventRecord(r.end, cudaStreamPerThread);
  std::lock_guard<std::mutex> lock(records_mu);
  records().push_back(r);
}

}  // namespace detail
}  // namespace distjax::tensor
