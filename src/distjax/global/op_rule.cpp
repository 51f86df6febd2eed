#include "distjax/global/op_rule.hpp"

#include <sstream>

namespace distjax::global {

std::string OpRule::str() const {
  std::ostringstream os;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    os << (i ? ", " : "") << inputs[i].to_string();
  os << " -> " << output.to_string() << " (" << bytes << " bytes)";
  return os.str();
}

}  // namespace distjax::global
