#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh), configures and builds into ${BUILD:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Where nvcc is, the CUDA backend builds; its cuDNN attention needs the cuDNN frontend's
# headers (PyPI). Without them the backend builds with its own attention kernels only.
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  bash scripts/fetch-cudnn-frontend.sh ||
    echo "[build] could not fetch the cuDNN frontend: CUDA builds without cuDNN attention" >&2
fi
BUILD=${BUILD:-build}
# The Python module (python/) builds when .venv-test has nanobind (scripts/setup_python.sh,
# which scripts/test.sh runs first), with that venv's interpreter; else it is left out.
PYTHON_FLAGS=(-DDISTJAX_BUILD_PYTHON=OFF)
if [ -x .venv-test/bin/python ] && .venv-test/bin/python -c "import nanobind" 2>/dev/null; then
  PYTHON_FLAGS=(-DDISTJAX_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$PWD/.venv-test/bin/python")
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${PYTHON_FLAGS[@]}" ${CMAKE_FLAGS:-} >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
