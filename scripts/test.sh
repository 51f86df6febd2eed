#!/usr/bin/env bash
# Set everything up, build, and run every test (ctest), as CI does.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The Python side of the checkpoint test and of the BPE shards' (safetensors and tokenizers
# from PyPI into .venv-test), and what the Python module builds and is tested with; without
# it those tests skip, or fail where DISTJAX_REQUIRE_SAFETENSORS / DISTJAX_REQUIRE_TOKENIZERS
# is set (CI), and the module is not built.
bash scripts/setup_python.sh || echo "[test] could not create .venv-test: the safetensors and tokenizers tests will not run, nor the Python module's" >&2
bash scripts/build.sh
BUILD=${BUILD:-build}
# Idle OpenMP threads sleep instead of spinning: ctest runs tests in parallel on few cores.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cd "$BUILD"
ctest --output-on-failure -j "$(nproc)" --timeout 600
