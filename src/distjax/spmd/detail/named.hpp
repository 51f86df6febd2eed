// The spmd layer's one way to name a communicator failure after the user-level op.
#pragma once

#include <string>

#include "distjax/core/error.hpp"

namespace distjax::spmd::detail {

/// Runs a communicator call; a CommError gets the user-level op and axes in front, so a
/// message names both (e.g. "[psum over "model"] [all_reduce/all_gather] devices disagree ...").
template <class F>
auto named(const char* op, const std::string& axes, F&& f) {
  try {
    return f();
  } catch (const CommError& e) {
    throw CommError(std::string("[") + op + " over " + axes + "] " + e.what());
  }
}

}  // namespace distjax::spmd::detail
