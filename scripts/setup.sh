#!/usr/bin/env bash
# Installs the Debian packages DistJax builds, tests and runs with (`setup.sh fuzz`: also
# those of `make fuzz`). Fast when they are already installed. Needs root (or sudo).
# Installs with --no-install-recommends, so every package a build needs is listed here,
# also where a -dev package only recommends it: Debian's dnnl-config.cmake calls
# find_package(OpenCL REQUIRED), hence ocl-icd-opencl-dev. `make fresh-check` proves the
# list on a clean Debian root; run it after changing this file.
set -euo pipefail
PKGS=(build-essential cmake ninja-build ccache pkg-config gnuplot-nox
      libdnnl-dev ocl-icd-opencl-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev zlib1g-dev
      libomp-dev libopenmpi-dev openmpi-bin libtomlplusplus-dev libcli11-dev python3-venv python3-dev python3-torch
      iproute2 dataset-fashion-mnist fortunes fortunes-min)
# `setup.sh fuzz` (make fuzz): clang and its runtimes (libFuzzer, ASan, UBSan), which
# libclang-common-*-dev only recommends.
if [ "${1:-}" = fuzz ]; then
  PKGS+=(clang libclang-rt-dev)
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "[setup] installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
