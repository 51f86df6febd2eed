#!/usr/bin/env bash
# Creates .venv-test, the Python environment of the tests that read DistJax files with
# other tools (tests/train/checkpoint_errors_test.cpp loads checkpoints with `safetensors`),
# of tools/prepare_tokens.py (BPE token shards with Hugging Face `tokenizers`) and of the
# Python module (python/: built with nanobind, tested with pytest, ml_dtypes' bfloat16 and
# JAX as the reference of its gradients). Debian 12 packages none of them in versions that
# fit, so they come from PyPI. Fast when the venv is ready.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-test
PY="$VENV/bin/python"
PKGS=(safetensors numpy tokenizers nanobind scikit-build-core pytest ml_dtypes jax)
CHECK="import safetensors.numpy, numpy, tokenizers, nanobind, scikit_build_core, pytest, ml_dtypes, jax"
if [ -x "$PY" ] && "$PY" -c "$CHECK" 2>/dev/null; then
  exit 0
fi
echo "[setup_python] creating $VENV with ${PKGS[*]} (pip)"
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
"$PY" -m pip install -q --disable-pip-version-check "${PKGS[@]}"
"$PY" -c "$CHECK"
