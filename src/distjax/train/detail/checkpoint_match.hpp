// Whether a checkpoint and the state loaded from it hold the same tensors: the strict check
// of load_checkpoint, with LoadOptions::drop, and the names it works on.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace distjax::train::detail {

/// The prefixes of the tensor names: "params/<path>", "opt_state/<slot>/<path>".
inline constexpr const char* kParams = "params/";
inline constexpr const char* kOptState = "opt_state/";

/// The parameter path of a tensor name: <path> of "params/<path>" and of
/// "opt_state/<slot>/<path>"; "" for other names.
std::string param_path(const std::string& name);

/// The first pattern of `drop` (globs: `*` any characters, `/` included) matching the
/// tensor `name` or its parameter path; null if none.
const std::string* dropped_by(const std::vector<std::string>& drop, const std::string& name);

/// Every name in `state` (the state's leaves on every device) is one of `saved` (the
/// tensors of the checkpoint in `dir`), and every saved tensor is in `state` or dropped by
/// `drop` (LoadOptions::drop); else InvalidArgument
/// "[load_checkpoint] "<index.json>" does not match the state being loaded: N tensors of
/// the state are missing from the checkpoint: "a", ...; M tensors of the checkpoint are
/// not in the state: ..." (five named of each, then "and K more"). A drop pattern matching
/// a tensor the state has is an InvalidArgument too.
void check_match(const std::string& dir, const std::vector<std::string>& saved,
                 const std::set<std::string>& state, const std::vector<std::string>& drop);

}  // namespace distjax::train::detail
