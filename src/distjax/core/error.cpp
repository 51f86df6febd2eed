#include "distjax/core/error.hpp"

#include <cstdlib>
#include <cstring>

namespace distjax::detail {

bool error_locations() {
  static const bool on = [] {
    const char* v = std::getenv("DISTJAX_DEBUG");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace distjax::detail
