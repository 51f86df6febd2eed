#!/usr/bin/env bash
# Set everything up, build, and run every test (ctest), as CI does.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD=${BUILD:-build}
cd "$BUILD"
ctest --output-on-failure -j "$(nproc)" --timeout 600
