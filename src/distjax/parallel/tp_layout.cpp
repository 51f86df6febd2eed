#include "distjax/parallel/tp_layout.hpp"

#include "distjax/core/error.hpp"

namespace distjax::parallel {

const char* tp_layout_name(TPLayout layout) {
  switch (layout) {
    case TPLayout::None:
      return "none";
    case TPLayout::Megatron:
      return "megatron";
    case TPLayout::Gather:
      return "gather";
    case TPLayout::Async:
      return "async";
  }
  return "?";
}

TPLayout tp_layout_from_name(const std::string& name) {
  for (TPLayout l : {TPLayout::None, TPLayout::Megatron, TPLayout::Gather, TPLayout::Async})
    if (name == tp_layout_name(l)) return l;
  DISTJAX_THROW(ConfigError, "[tp_layout] unknown layout \"", name,
                "\"; expected none, megatron, gather or async");
}

std::string describe(const TPPlan& tp) {
  std::string s = tp_layout_name(tp.layout);
  if (tp.sequence_parallel) s += " + sequence parallel";
  if (tp.vocab_parallel) s += " + vocabulary parallel";
  if (tp.layout == TPLayout::Async && tp.bidirectional) s += " (bidirectional rings)";
  return s;
}

}  // namespace distjax::parallel
