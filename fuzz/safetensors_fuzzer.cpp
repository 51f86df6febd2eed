// libFuzzer target of the safetensors reader of checkpoints (train::detail::SafetensorsReader):
// the input is the file. The reader opens it, checks its header; each entry is then checked
// as load_checkpoint checks it against an index saying the entry's own dtype and shape, and its
// data read. A distjax::Error is the reader's clean refusal; anything else is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "distjax/core/error.hpp"
#include "distjax/train/detail/safetensors.hpp"

using namespace distjax;
namespace st = distjax::train::detail;

namespace {

// The reader takes a path: the input goes into a memory file, opened through /proc.
const std::string& memory_file(int* fd) {
  static const int f = ::memfd_create("safetensors_fuzzer", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(f);
  if (f < 0) std::abort();
  *fd = f;
  return path;
}

void run(const std::string& path) {
  const st::SafetensorsReader reader(path, "fuzz");
  for (const auto& [name, e] : reader.entries()) {
    for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::F64}) {
      if (e.dtype != st::safetensors_dtype(t)) continue;
      const st::SafetensorsEntry& checked = reader.entry(name, t, e.shape);
      std::vector<char> data(checked.end - checked.begin);
      reader.read(checked, 0, data.data(), data.size());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  int fd = -1;
  const std::string& path = memory_file(&fd);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))
    std::abort();
  try {
    run(path);
  } catch (const Error&) {
    // The reader's refusal, naming the file and what is wrong: the expected outcome.
  }
  return 0;
}
