# CUDA and NCCL detection, included by the top-level CMakeLists.txt before the library is
# defined. Reads DISTJAX_WITH_CUDA (AUTO, ON or OFF); sets DISTJAX_HAVE_CUDA and
# DISTJAX_HAVE_NCCL (with DISTJAX_NCCL_INCLUDE_DIR and DISTJAX_NCCL_LIBRARY) and
# DISTJAX_HAVE_CUDNN_FRONTEND (cuDNN's attention, see below), enables the
# CUDA language and finds CUDAToolkit (CUDA::cudart, CUDA::cublasLt) when CUDA is on.
#
# AUTO turns CUDA on where nvcc and the toolkit are found, which is true of machines that
# cannot run CUDA code (no driver, no GPU): such a build compiles the .cu files, and the
# tests labelled "gpu" skip at run time, saying why.

string(TOUPPER "${DISTJAX_WITH_CUDA}" _distjax_cuda_mode)
if(NOT _distjax_cuda_mode STREQUAL "AUTO")
  if(DISTJAX_WITH_CUDA)  # ON, TRUE, YES, 1
    set(_distjax_cuda_mode ON)
  else()
    set(_distjax_cuda_mode OFF)
  endif()
endif()

set(DISTJAX_HAVE_CUDA OFF)
set(DISTJAX_HAVE_NCCL OFF)
if(_distjax_cuda_mode STREQUAL "OFF")
  set(_distjax_cuda_why "DISTJAX_WITH_CUDA=${DISTJAX_WITH_CUDA}")
else()
  # nvcc is often not on PATH (it lives in /usr/local/cuda/bin): point check_language at it
  # through CUDACXX, unless the caller chose a compiler.
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(DISTJAX_NVCC nvcc HINTS ENV CUDA_PATH ENV CUDA_HOME PATH_SUFFIXES bin
                 PATHS /usr/local/cuda/bin)
    if(DISTJAX_NVCC)
      set(ENV{CUDACXX} ${DISTJAX_NVCC})
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # sm_90 (H100, H200) as machine code, plus its PTX so later GPUs JIT it. Override with
    # -DCMAKE_CUDA_ARCHITECTURES=... (e.g. "80-real;90-real;90-virtual").
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90-real 90-virtual)
    endif()
    # The library is shared and the gpu tests call the runtime too: one shared cudart for
    # both (CMake's default for CUDA targets is the static one).
    if(NOT DEFINED CMAKE_CUDA_RUNTIME_LIBRARY)
      set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    endif()
    if(DISTJAX_CCACHE AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${DISTJAX_CCACHE})
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    # cuBLASLt is required (the GEMMs will use it), but linked only once something calls it.
    if(CUDAToolkit_FOUND AND TARGET CUDA::cudart AND TARGET CUDA::cublasLt)
      set(DISTJAX_HAVE_CUDA ON)
      string(CONCAT _distjax_cuda_why "nvcc ${CMAKE_CUDA_COMPILER_VERSION} at "
                    "${CMAKE_CUDA_COMPILER}, architectures \"${CMAKE_CUDA_ARCHITECTURES}\"")
    else()
      string(CONCAT _distjax_cuda_why "nvcc found at ${CMAKE_CUDA_COMPILER}, but not the CUDA "
                    "toolkit's cudart and cuBLASLt (find_package(CUDAToolkit))")
    endif()
  else()
    string(CONCAT _distjax_cuda_why "no working CUDA compiler: nvcc is neither on PATH nor in "
                  "/usr/local/cuda/bin (set CUDACXX or CMAKE_CUDA_COMPILER)")
  endif()
  if(_distjax_cuda_mode STREQUAL "ON" AND NOT DISTJAX_HAVE_CUDA)
    message(FATAL_ERROR "DistJax: DISTJAX_WITH_CUDA=ON, but ${_distjax_cuda_why}")
  endif()
endif()
message(STATUS "DistJax: CUDA backend ${DISTJAX_HAVE_CUDA} (${_distjax_cuda_why})")

# cuDNN's fused attention (tensor/cuda/attention_cudnn.cpp): the cuDNN frontend's headers
# (scripts/fetch-cudnn-frontend.sh puts them in .deps/) and cudnn.h. cuDNN itself is loaded
# at run time (dlopen), so a build with them runs where cuDNN is missing (own kernels).
set(DISTJAX_HAVE_CUDNN_FRONTEND OFF)
if(DISTJAX_HAVE_CUDA)
  set(DISTJAX_CUDNN_FRONTEND_DIR "${PROJECT_SOURCE_DIR}/.deps/cudnn-frontend/include" CACHE PATH
      "Folder of cudnn_frontend.h (scripts/fetch-cudnn-frontend.sh)")
  find_path(DISTJAX_CUDNN_INCLUDE_DIR cudnn.h HINTS ENV CUDNN_HOME ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  if(EXISTS "${DISTJAX_CUDNN_FRONTEND_DIR}/cudnn_frontend.h" AND DISTJAX_CUDNN_INCLUDE_DIR)
    set(DISTJAX_HAVE_CUDNN_FRONTEND ON)
    set(_distjax_cudnn_why "frontend ${DISTJAX_CUDNN_FRONTEND_DIR}, cudnn.h in "
                           "${DISTJAX_CUDNN_INCLUDE_DIR}; libcudnn.so.9 loaded at run time")
  else()
    string(CONCAT _distjax_cudnn_why "cudnn_frontend.h: ${DISTJAX_CUDNN_FRONTEND_DIR}, cudnn.h: "
                  "${DISTJAX_CUDNN_INCLUDE_DIR}; run scripts/fetch-cudnn-frontend.sh, or set "
                  "DISTJAX_CUDNN_FRONTEND_DIR and DISTJAX_CUDNN_INCLUDE_DIR; the own kernels run")
  endif()
else()
  set(_distjax_cudnn_why "needs the CUDA backend")
endif()
message(STATUS "DistJax: cuDNN attention ${DISTJAX_HAVE_CUDNN_FRONTEND} (${_distjax_cudnn_why})")

# NCCL: nccl.h (which includes cuda_runtime.h, hence only with CUDA) and libnccl. Machines
# with only the runtime library have libnccl.so.2 and no libnccl.so link, hence both names.
if(DISTJAX_HAVE_CUDA)
  find_path(DISTJAX_NCCL_INCLUDE_DIR nccl.h HINTS ENV NCCL_HOME ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(DISTJAX_NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS ENV NCCL_HOME ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(DISTJAX_NCCL_INCLUDE_DIR AND DISTJAX_NCCL_LIBRARY)
    set(DISTJAX_HAVE_NCCL ON)
    set(_distjax_nccl_why "${DISTJAX_NCCL_LIBRARY}")
  else()
    string(CONCAT _distjax_nccl_why "nccl.h: ${DISTJAX_NCCL_INCLUDE_DIR}, libnccl: "
                  "${DISTJAX_NCCL_LIBRARY}; set NCCL_HOME, or DISTJAX_NCCL_INCLUDE_DIR and "
                  "DISTJAX_NCCL_LIBRARY")
  endif()
else()
  set(_distjax_nccl_why "needs the CUDA backend")
endif()
if(DISTJAX_HAVE_NCCL)
  string(APPEND _distjax_nccl_why "; the nccl communicator backend")
else()
  string(APPEND _distjax_nccl_why "; backend nccl refused at launch")
endif()
message(STATUS "DistJax: NCCL ${DISTJAX_HAVE_NCCL} (${_distjax_nccl_why})")
