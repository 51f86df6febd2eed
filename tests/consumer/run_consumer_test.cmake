# Installs the built library into a scratch prefix and builds tests/consumer against
# it with find_package(distjax), then runs the program; builds the same program with the
# compiler line docs/app.md gives and runs it; runs the installed distjax command. Each
# runs without LD_LIBRARY_PATH: the binaries find the library by their runtime path.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configure of the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "build of the consumer failed: ${rc}")
endif()
execute_process(COMMAND env -u LD_LIBRARY_PATH ${WORK_DIR}/build/consumer RESULT_VARIABLE rc
                OUTPUT_VARIABLE out)
message(STATUS "consumer said: ${out}")
if(rc OR NOT out MATCHES "consumer ok")
  message(FATAL_ERROR "consumer program failed: ${rc}")
endif()

# The compiler line of docs/app.md ("A program of your own").
set(prefix ${WORK_DIR}/prefix)
set(libdir ${prefix}/${LIBDIR})
execute_process(COMMAND ${CXX} -std=c++20 -O2 ${SOURCE_DIR}/tests/consumer/main.cpp
                        -I${prefix}/include -L${libdir} -ldistjax -Wl,-rpath,${libdir} -pthread
                        -o ${WORK_DIR}/consumer_gxx
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "the compiler line of docs/app.md failed: ${rc}\n${err}")
endif()
execute_process(COMMAND env -u LD_LIBRARY_PATH ${WORK_DIR}/consumer_gxx
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc OR NOT out MATCHES "consumer ok")
  message(FATAL_ERROR "the program built by the compiler line failed: ${rc}\n${out}${err}")
endif()

# The installed distjax command runs as installed.
if(EXISTS ${prefix}/bin/distjax)
  execute_process(COMMAND env -u LD_LIBRARY_PATH ${prefix}/bin/distjax --help
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc OR NOT out MATCHES "distjax: distributed training")
    message(FATAL_ERROR "the installed distjax does not run: ${rc}\n${out}${err}")
  endif()
endif()
