// libFuzzer target of the config reader: what `distjax train` does with a TOML file and its
// `--set` overrides, up to the point where it would write anything.
//
// Input: a TOML document, then optionally a NUL byte and `--set` assignments, one per line
// ("run.steps=3\nmodel.d_model=64"). A distjax::Error is the reader's clean refusal; any other
// exception, a crash or a sanitizer report is a finding. One more rule: the document to_toml
// prints for an accepted config (what `--print-config` and config.toml hold) reads back to the
// same config.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "distjax/app/model.hpp"
#include "distjax/app/train.hpp"
#include "distjax/comm/launch_environment.hpp"
#include "distjax/config/config_file.hpp"
#include "distjax/core/error.hpp"

using namespace distjax;

namespace {

// The overrides after the first NUL: at most this many lines (as many --set as a person types).
constexpr std::size_t kMaxOverrides = 8;

void run(std::string_view input) {
  const std::size_t nul = input.find('\0');
  const std::string_view toml = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = input.substr(nul + 1);
    while (!rest.empty() && overrides.size() < kMaxOverrides) {
      const std::size_t eol = rest.find('\n');
      overrides.emplace_back(rest.substr(0, eol));
      rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
    }
  }
  // config::load_config without the file.
  config::TrainConfig c;
  config::apply_toml(c, toml, "fuzz.toml");
  for (const std::string& o : overrides)
    config::apply_override(c, o);

  const std::string printed = config::to_toml(c);
  config::TrainConfig again;
  try {
    config::apply_toml(again, printed, "to_toml");
  } catch (const Error& e) {
    std::fprintf(stderr, "to_toml printed a document the reader refuses:\n%s\n%s\n",
                 printed.c_str(), e.what());
    std::abort();
  }
  if (config::to_toml(again) != printed) {
    std::fprintf(stderr, "to_toml does not read back to the same config:\n%s\n---\n%s\n",
                 printed.c_str(), config::to_toml(again).c_str());
    std::abort();
  }

  // app::prepare_program's checks, without the environment and the output directory.
  app::find_model(c.run.program);
  c.distributed = config::resolve(c.distributed, comm::LaunchEnvironment{});
  c.validate("fuzz.toml");
  app::check_program(c);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    run(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const Error&) {
    // The reader's refusal, naming the key and what is wrong: the expected outcome.
  }
  return 0;
}
