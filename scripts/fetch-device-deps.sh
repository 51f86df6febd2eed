#!/usr/bin/env bash
# Run here (a machine with apt), once: puts into .device-deps/ (git-ignored) what
# scripts/gpu-machine.sh needs on the GPU machine, which has no package registry: the Debian
# packages of the build and OpenMPI (about 48 MB of .deb files, unpacked there into a prefix)
# and NCCL's header (that machine has NCCL's runtime library, perhaps without nccl.h).
# Then carry .device-deps/ to the GPU machine along with the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${DEPS:-.device-deps}
# scripts/setup.sh's build packages that Ubuntu 24.04 lacks there, with what they need
# (Debian's dnnl-config.cmake wants OpenCL), and the data the programs read by default.
PKGS=(libdnnl-dev libdnnl2 ocl-icd-opencl-dev opencl-c-headers opencl-clhpp-headers
      ocl-icd-libopencl1 nlohmann-json3-dev libtomlplusplus-dev libtomlplusplus3 libcli11-dev
      libgtest-dev libgmock-dev fortunes fortunes-min dataset-fashion-mnist
      # OpenMPI (4.8 MB), relocated there by gpu-machine.sh's mpi_env: what mpicc and
      # mpirun -np 4 on one machine load. Left out: the fabrics (ucx, libfabric, psm, verbs,
      # libnl), whose plugins are turned off there (Debian's openmpi-mca-params.conf and
      # mpi_env), and libopenmpi-dev's -dev dependencies, which mpicc does not need.
      openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libmunge2 libhwloc15
      libevent-core-2.1-7 libevent-pthreads-2.1-7
      # gdb for the threads' backtraces of a hung run (3.6 MB; that machine has none):
      # gdb-minimal (no Python, so none of libpython3.11's chain) with the libraries it links
      # that Ubuntu 24.04 may lack, unpacked beside it (gpu-machine.sh's gdb_env; its
      # libdebuginfod.so.1 is a stub built there, the real one wants libcurl-gnutls).
      gdb-minimal libipt2 libreadline8 libexpat1 libxxhash0)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
mkdir -p "$DEPS"
rm -f "$DEPS"/*.deb
(cd "$DEPS" && apt-get download "${PKGS[@]}")
# nccl.h as the CUDA toolkit here has it (NCCL 2.28.x; the GPU machine's library is 2.28 too).
for h in /usr/local/cuda/include/nccl.h /usr/include/nccl.h; do
  if [ -f "$h" ]; then
    mkdir -p "$DEPS/nccl/include"
    cp -L "$h" "$DEPS/nccl/include/nccl.h"
    break
  fi
done
# cuDNN's attention: the cuDNN frontend's headers (scripts/fetch-cudnn-frontend.sh, PyPI) and
# cudnn.h as the CUDA toolkit here has it (cuDNN 9; that machine has cuDNN 9 as a pip
# package, whose headers the build need not find).
bash scripts/fetch-cudnn-frontend.sh
rm -rf "$DEPS/cudnn-frontend" "$DEPS/cudnn"
cp -r .deps/cudnn-frontend "$DEPS/cudnn-frontend"
if compgen -G "/usr/local/cuda/include/cudnn*.h" >/dev/null; then
  mkdir -p "$DEPS/cudnn/include"
  cp -L /usr/local/cuda/include/cudnn*.h "$DEPS/cudnn/include/"
fi
echo "[fetch-device-deps] $(find "$DEPS" -maxdepth 1 -name '*.deb' | wc -l) packages, $(du -sh "$DEPS" | cut -f1) in $DEPS"
