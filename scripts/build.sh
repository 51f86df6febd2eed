#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh), configures and builds into ${BUILD:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD=${BUILD:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_FLAGS:-} >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
