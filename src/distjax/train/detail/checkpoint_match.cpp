#include "distjax/train/detail/checkpoint_match.hpp"

#include <fnmatch.h>

#include <cstring>
#include <filesystem>

#include "distjax/core/error.hpp"

namespace distjax::train::detail {

namespace {

// How many `names` there are and the first five: 7 + " tensors of ..." -> `7 tensors of ...:
// "a", "b", "c", "d", "e" and 2 more`.
std::string some_names(const std::vector<std::string>& names, const char* one, const char* many) {
  constexpr std::size_t kShown = 5;
  std::string out = std::to_string(names.size()) + (names.size() == 1 ? one : many) + ": ";
  for (std::size_t i = 0; i < names.size() && i < kShown; ++i)
    out += (i ? ", \"" : "\"") + names[i] + "\"";
  if (names.size() > kShown) out += " and " + std::to_string(names.size() - kShown) + " more";
  return out;
}

}  // namespace

std::string param_path(const std::string& name) {
  if (name.rfind(kParams, 0) == 0) return name.substr(std::strlen(kParams));
  if (name.rfind(kOptState, 0) != 0) return "";
  const std::string rest = name.substr(std::strlen(kOptState));
  const auto slash = rest.find('/');
  return slash == std::string::npos ? "" : rest.substr(slash + 1);
}

const std::string* dropped_by(const std::vector<std::string>& drop, const std::string& name) {
  const std::string path = param_path(name);
  for (const std::string& p : drop)
    if (::fnmatch(p.c_str(), name.c_str(), 0) == 0 ||
        (!path.empty() && ::fnmatch(p.c_str(), path.c_str(), 0) == 0))
      return &p;
  return nullptr;
}

void check_match(const std::string& dir, const std::vector<std::string>& saved_names,
                 const std::set<std::string>& state, const std::vector<std::string>& drop) {
  const std::string where = (std::filesystem::path(dir) / "index.json").string();
  std::set<std::string> saved;
  std::vector<std::string> extra, missing;
  for (const std::string& name : saved_names) {
    saved.insert(name);
    if (!state.contains(name) && dropped_by(drop, name) == nullptr) extra.push_back(name);
  }
  for (const std::string& name : state) {
    const std::string* pattern = dropped_by(drop, name);
    DISTJAX_CHECK(pattern == nullptr || !saved.contains(name), InvalidArgument,
                  "[load_checkpoint] \"", where, "\": the drop pattern \"", *pattern,
                  "\" matches \"", name,
                  "\", which the state being loaded has: drop only tensors the state has no "
                  "leaf for");
    if (!saved.contains(name)) missing.push_back(name);
  }
  if (missing.empty() && extra.empty()) return;
  std::string msg = "[load_checkpoint] \"" + where + "\" does not match the state being loaded: ";
  if (!missing.empty())
    msg += some_names(missing, " tensor of the state is missing from the checkpoint",
                      " tensors of the state are missing from the checkpoint");
  if (!extra.empty())
    msg += (missing.empty() ? "" : "; ") +
           some_names(extra, " tensor of the checkpoint is not in the state",
                      " tensors of the checkpoint are not in the state");
  msg += ". Load into a state with the checkpoint's parameters and optimizer";
  if (!extra.empty())
    msg +=
        ", or name the checkpoint's tensors to leave out (globs on the name or the "
        "parameter path) in LoadOptions::drop, run.resume_drop";
  DISTJAX_THROW(InvalidArgument, msg);
}

}  // namespace distjax::train::detail
