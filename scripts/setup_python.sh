#!/usr/bin/env bash
# Creates .venv-test, the Python environment of the tests that read DistJax files with
# other tools (tests/train/checkpoint_errors_test.cpp loads checkpoints with `safetensors`)
# and of tools/prepare_tokens.py (BPE token shards with Hugging Face `tokenizers`).
# Debian 12 packages neither, so they come from PyPI. Fast when the venv is ready.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-test
PY="$VENV/bin/python"
if [ -x "$PY" ] && "$PY" -c "import safetensors.numpy, numpy, tokenizers" 2>/dev/null; then
  exit 0
fi
echo "[setup_python] creating $VENV with safetensors, numpy and tokenizers (pip)"
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
"$PY" -m pip install -q --disable-pip-version-check safetensors numpy tokenizers
"$PY" -c "import safetensors.numpy, numpy, tokenizers"
