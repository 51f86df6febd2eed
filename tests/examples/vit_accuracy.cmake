# The Vision Transformer that examples/vit.cpp registers, trained from examples/vit.toml
# (one epoch on ("data"=2, "model"=2, "pipe"=2)), reaches the test accuracy docs/app.md
# states: at least MIN_ACCURACY (measured 0.829).
#   cmake -DVIT=<binary> -DCONFIG=<vit.toml> -DOUT=<dir> -DMIN_ACCURACY=0.80 -P vit_accuracy.cmake
file(REMOVE_RECURSE "${OUT}")
execute_process(COMMAND "${VIT}" "${CONFIG}" "run.out_dir=${OUT}" RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "vit exited with ${status}")
endif()
file(READ "${OUT}/summary.json" summary)
string(JSON accuracy GET "${summary}" test_accuracy)
message(STATUS "test accuracy ${accuracy} (at least ${MIN_ACCURACY})")
if(accuracy LESS MIN_ACCURACY)
  message(FATAL_ERROR "test accuracy ${accuracy} is below ${MIN_ACCURACY}")
endif()
