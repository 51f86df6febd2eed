// The models the library registers (app/model.hpp), one file each in src/distjax/app/.
#pragma once

#include <vector>

#include "distjax/app/model.hpp"

namespace distjax::app::detail {

ModelSpec classifier_model();     // classifiers.cpp
ModelSpec tp_classifier_model();  // classifiers.cpp
ModelSpec pp_classifier_model();  // classifiers.cpp
ModelSpec gpt_model();            // gpt.cpp

inline std::vector<ModelSpec> builtin_models() {
  return {classifier_model(), tp_classifier_model(), pp_classifier_model(), gpt_model()};
}

}  // namespace distjax::app::detail
