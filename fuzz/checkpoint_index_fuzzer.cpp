// libFuzzer target of the checkpoint index reader: the input is an index.json, parsed and
// checked by train::parse_checkpoint_index (what read_checkpoint_index, load_checkpoint and
// `distjax ckpt inspect` run on the file) and printed as `distjax ckpt inspect` prints it. A
// distjax::Error is the reader's clean refusal; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "distjax/core/error.hpp"
#include "distjax/train/checkpoint.hpp"

using namespace distjax;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const train::CheckpointIndex index = train::parse_checkpoint_index(
        std::string(reinterpret_cast<const char*>(data), size), "fuzz/index.json");
    std::ostringstream os;
    train::print_checkpoint_index(index, os);
  } catch (const Error&) {
    // The reader's refusal, naming the file and what is wrong: the expected outcome.
  }
  return 0;
}
