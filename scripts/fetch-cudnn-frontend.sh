#!/usr/bin/env bash
# Puts the headers of NVIDIA's cuDNN frontend (the header-only C++ graph API over cuDNN's
# backend, Apache 2.0 licence) into .deps/cudnn-frontend/include (git-ignored), where CMake finds
# them: the CUDA backend's bf16 attention runs cuDNN's fused SDPA through them. They come
# from PyPI (the nvidia-cudnn-frontend wheel carries them beside its Python module), at a
# pinned version. Only builds with the CUDA toolkit need them; without them the CUDA backend
# builds without cuDNN attention and says so. Fast when they are in place.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.32.0
DEST=.deps/cudnn-frontend
if [ -f "$DEST/include/cudnn_frontend.h" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  exit 0
fi
# pip: the system's, else a throwaway venv's (Debian's python3 has no pip module; venv has).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PY=/usr/bin/python3
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  "$PY" -m venv "$tmp/venv"
  PY="$tmp/venv/bin/python"
fi
echo "[fetch-cudnn-frontend] nvidia-cudnn-frontend $VERSION (PyPI) -> $DEST"
# The headers are the same in every wheel of a version: ask for one fixed platform.
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --platform manylinux_2_28_x86_64 --python-version 3.11 -d "$tmp" \
  "nvidia-cudnn-frontend==$VERSION"
rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" - "$tmp" "$DEST" <<'EOF'
import glob, sys, zipfile
src, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(src + "/nvidia_cudnn_frontend-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    z.extractall(dest, names)
    for n in z.namelist():  # the licence travels with the headers
        if n.endswith("LICENSE") or n.endswith("LICENSE.txt"):
            with open(dest + "/LICENSE", "wb") as f:
                f.write(z.read(n))
            break
print(f"[fetch-cudnn-frontend] {len(names)} files")
EOF
echo "$VERSION" >"$DEST/VERSION"
