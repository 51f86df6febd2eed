#!/usr/bin/env bash
# The DistJax benchmark suite (`make bench`): runs every bench_* executable of the build
# directory and the PyTorch / JAX references in one run, writing one JSON object per
# line to bench/results/latest.jsonl, then prints a summary table with the ratios.
#
#   bash bench/run.sh [BUILD_DIR]        (default: build)
#   BENCH_SECONDS=4   timed seconds per model, configuration and round in the training benchmarks
#   BENCH_SKIP_JAX=1  skip the JAX reference (no venv, no pip)
#   BENCH_NO_INSTALL=1  never install packages (PyTorch, OpenBLAS, the JAX venv)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
SECONDS_PER="${BENCH_SECONDS:-4}"
RESULTS="$ROOT/bench/results"
OUT="$RESULTS/latest.jsonl"
mkdir -p "$RESULTS"
: > "$OUT"
export DISTJAX_BENCH_OUT="$OUT"
unset OPENBLAS_CORETYPE
T0=$(date +%s)

log() { echo "[bench] $*"; }

# note NAME REASON: records that a measurement could not be made, and why.
note() {
  /usr/bin/python3 -c 'import json,sys; print(json.dumps({"name": sys.argv[1], "value": None, "unit": "unavailable", "reason": sys.argv[2]}))' "$1" "$2" >> "$OUT"
  log "$1: $2"
}

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
apt_install() {  # best effort; returns non-zero when it cannot install
  [ -n "${BENCH_NO_INSTALL:-}" ] && return 1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 && return 0
  $SUDO apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1
}

# ------------------------------------------------------------------ environment
/usr/bin/python3 - "$OUT" "$ROOT" <<'EOF'
import json, os, platform, subprocess, sys, time
out, root = sys.argv[1], sys.argv[2]
def sh(c):
    try: return subprocess.run(c, shell=True, capture_output=True, text=True, cwd=root).stdout.strip()
    except Exception: return ""
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
load = os.getloadavg()
rec = {"name": "environment_loadavg_1min", "value": load[0], "unit": "load",
       "loadavg": list(load), "cpus": os.cpu_count(), "cpu_model": model,
       "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_commit": sh("git rev-parse --short HEAD"),
       "git_dirty": bool(sh("git status --porcelain --untracked-files=no")), "kernel": platform.release(),
       "note": "other processes on the machine share its cores; compare ratios, not absolute values"}
open(out, "a").write(json.dumps(rec) + "\n")
EOF

# ------------------------------------------------------------------ dependencies of the references
HAVE_TORCH=0
if /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then HAVE_TORCH=1
elif apt_install python3-torch && /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then HAVE_TORCH=1
fi
# Debian's libtorch recommends OpenBLAS; without it PyTorch falls back to the reference BLAS.
if [ "$HAVE_TORCH" = 1 ] && ! dpkg-query -W -f='${Status}' libopenblas0 2>/dev/null | grep -q "install ok installed"; then
  apt_install libopenblas0 || log "OpenBLAS not installed: PyTorch uses the reference BLAS (see the 'blas' field)"
fi

HAVE_JAX=0
JAXPY="$ROOT/.venv-bench/bin/python"
if [ -n "${BENCH_SKIP_JAX:-}" ]; then
  note jax_unavailable "skipped (BENCH_SKIP_JAX set)"
else
  if ! "$JAXPY" -c 'import jax' >/dev/null 2>&1 && [ -z "${BENCH_NO_INSTALL:-}" ]; then
    log "creating .venv-bench with jax[cpu] (pip)"
    rm -rf "$ROOT/.venv-bench"
    if ! /usr/bin/python3 -m venv "$ROOT/.venv-bench" >/tmp/distjax-bench-venv.log 2>&1; then
      apt_install python3-venv && /usr/bin/python3 -m venv "$ROOT/.venv-bench" >/tmp/distjax-bench-venv.log 2>&1
    fi
    [ -x "$JAXPY" ] && timeout 600 "$JAXPY" -m pip install -q "jax[cpu]" >>/tmp/distjax-bench-venv.log 2>&1
  fi
  if "$JAXPY" -c 'import jax' >/dev/null 2>&1; then HAVE_JAX=1
  else note jax_unavailable "could not create the venv or pip install jax[cpu]: $(tail -n 2 /tmp/distjax-bench-venv.log 2>/dev/null | tr '\n' ' ' | cut -c1-300)"
  fi
fi

# ------------------------------------------------------------------ runners
run_native() {  # run_native EXE ARGS...
  local exe="$1"; shift
  log "$(basename "$exe") $*"
  timeout 600 "$exe" "$@" > "/tmp/distjax-bench-$(basename "$exe").log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || note "$(basename "$exe")_failed" "exit code $rc: $(tail -n 3 "/tmp/distjax-bench-$(basename "$exe").log" | tr '\n' ' ' | cut -c1-300)"
}
run_torch() {  # run_torch [--threads N]; with N set, OpenBLAS gets N threads too
  if [ "$HAVE_TORCH" != 1 ]; then return; fi
  log "PyTorch reference $*"
  local env=()
  if [ "${1:-}" = "--threads" ]; then env=(OPENBLAS_NUM_THREADS="$2"); fi
  env "${env[@]}" timeout 600 /usr/bin/python3 "$ROOT/bench/reference/torch_train.py" --seconds "$SECONDS_PER" "$@" \
    >/tmp/distjax-bench-torch.log 2>&1 || note pytorch_failed "$(tail -n 3 /tmp/distjax-bench-torch.log | tr '\n' ' ' | cut -c1-300)"
}
run_jax() {
  if [ "$HAVE_JAX" != 1 ]; then return; fi
  log "JAX reference"
  timeout 600 "$JAXPY" "$ROOT/bench/reference/jax_train.py" --seconds "$SECONDS_PER" \
    >/tmp/distjax-bench-jax.log 2>&1 || note jax_failed "$(tail -n 3 /tmp/distjax-bench-jax.log | tr '\n' ' ' | cut -c1-300)"
}
# The same GPT with Megatron tensor parallelism over 2 simulated XLA CPU devices
# (shard_map, one thread per device): the baseline of DistJax's TP GPT step.
run_jax_tp() {
  if [ "$HAVE_JAX" != 1 ]; then return; fi
  log "JAX tensor-parallel reference (shard_map, 2 devices)"
  timeout 600 "$JAXPY" "$ROOT/bench/reference/jax_tp_gpt.py" --devices 2 --seconds "$SECONDS_PER" \
    >/tmp/distjax-bench-jax-tp.log 2>&1 || note jax_tp_failed "$(tail -n 3 /tmp/distjax-bench-jax-tp.log | tr '\n' ' ' | cut -c1-300)"
}
[ "$HAVE_TORCH" = 1 ] || note pytorch_unavailable "python3-torch is not installed and could not be installed"

# ------------------------------------------------------------------ the runs
if [ ! -d "$BUILD" ]; then
  note bench_build_missing "no build directory $BUILD (run make build first)"
fi
# Training throughput first, in two rounds that alternate the frameworks, so that load
# from other processes hits all of them alike; comparisons take each configuration's
# best round (bench/summarize.py). Then GEMM and the other bench_* executables.
for round in 1 2; do
  export DISTJAX_BENCH_ROUND=$round
  extra=(); [ $round = 1 ] && extra=(--phases)
  [ -x "$BUILD/bench_train" ] && run_native "$BUILD/bench_train" --seconds "$SECONDS_PER" "${extra[@]}"
  run_torch
  [ $round = 1 ] && run_jax
  [ $round = 1 ] && run_jax_tp
  # DistJax's tensor-parallel benchmarks right after the JAX TP reference (its baseline);
  # it alternates its own configurations in rounds inside, so it runs once.
  [ $round = 1 ] && [ -x "$BUILD/bench_tp" ] && run_native "$BUILD/bench_tp" --seconds "$SECONDS_PER"
  # Data parallelism and ZeRO-3 on 2 devices (issue 8); it alternates its configurations in
  # rounds inside too, so it runs once.
  [ $round = 1 ] && [ -x "$BUILD/bench_dp" ] && run_native "$BUILD/bench_dp" --seconds "$SECONDS_PER"
  [ -x "$BUILD/bench_train" ] && run_native "$BUILD/bench_train" --seconds "$SECONDS_PER" --threads 1
  run_torch --threads 1
  # DistJax with OpenMP threads that sleep instead of spinning while they wait: on a
  # machine whose cores are shared with other processes this matters a lot (README).
  [ -x "$BUILD/bench_train" ] && OMP_WAIT_POLICY=PASSIVE run_native "$BUILD/bench_train" --seconds "$SECONDS_PER" --tag omp_passive
  [ $round = 2 ] && run_torch --threads 2
done
unset DISTJAX_BENCH_ROUND

for exe in "$BUILD"/bench_*; do
  [ -x "$exe" ] && [ -f "$exe" ] || continue
  name="$(basename "$exe")"
  [ "$name" = bench_train ] && continue
  [ "$name" = bench_tp ] && continue  # ran in round 1 above
  [ "$name" = bench_dp ] && continue  # ran in round 1 above
  case $name in bench_gpu_*) continue ;; esac  # GPU benchmarks: bench/gpu.sh (make bench-gpu)
  run_native "$exe"
  # The communication benchmark again under MPI (2 ranks) when it was built with MPI.
  if [ "$name" = bench_comm ] && command -v mpirun >/dev/null 2>&1 && ldd "$exe" 2>/dev/null | grep -q libmpi; then
    log "bench_comm under mpirun -np 2"
    DISTJAX_BENCH_MPI=1 timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2 "$exe" \
      >/tmp/distjax-bench-bench_comm-mpi.log 2>&1 || note bench_comm_mpi_failed "$(tail -n 3 /tmp/distjax-bench-bench_comm-mpi.log | tr '\n' ' ' | cut -c1-300)"
  fi
done

# Across two hosts made of network namespaces (root only): bench/hosts.sh.
if [ "$(id -u)" -eq 0 ] && command -v mpirun >/dev/null 2>&1 && [ -x "$BUILD/bench_comm" ] &&
  ldd "$BUILD/bench_comm" 2>/dev/null | grep -q libmpi; then
  log "across 2 hosts (bench/hosts.sh)"
  timeout 900 bash "$ROOT/bench/hosts.sh" "$BUILD" >/tmp/distjax-bench-hosts.log 2>&1 ||
    note hosts2_bench_failed "$(tail -n 3 /tmp/distjax-bench-hosts.log | tr '\n' ' ' | cut -c1-300)"
fi

# ------------------------------------------------------------------ ratios and summary
/usr/bin/python3 "$ROOT/bench/summarize.py" "$OUT"
log "wrote $(wc -l < "$OUT") lines to ${OUT#$ROOT/} in $(( $(date +%s) - T0 )) s"
