#!/usr/bin/env bash
# Set everything up, build, and run every test (ctest), as CI does.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD=${BUILD:-build}
# Idle OpenMP threads sleep instead of spinning: ctest runs tests in parallel on few cores.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cd "$BUILD"
ctest --output-on-failure -j "$(nproc)" --timeout 600
