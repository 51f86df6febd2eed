#!/usr/bin/env bash
# Side-by-side timing of two builds (e.g. before and after a change): runs the native
# benchmarks of both, alternating A, B, A, B..., and prints each line's median per build
# and the ratio B / A. The PyTorch and JAX references are the same for both builds, so
# comparing the builds' own lines compares their ratios to the references.
#
#   bash bench/compare.sh BUILD_A BUILD_B [ROUNDS]       (default 3 rounds)
#   BENCH_SECONDS=2   timed seconds per model and configuration
#   BENCH_ONLY="bench_gemm bench_train"   the benchmarks to run (default: gemm train dp tp pp)
set -uo pipefail
A="$1"
B="$2"
ROUNDS="${3:-3}"
SECONDS_PER="${BENCH_SECONDS:-2}"
ONLY="${BENCH_ONLY:-bench_gemm bench_train bench_dp bench_tp bench_pp}"
OUT="$(mktemp -d)"
unset OPENBLAS_CORETYPE
export OMP_WAIT_POLICY=passive
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    build="$A"
    [ "$side" = B ] && build="$B"
    for exe in $ONLY; do
      [ -x "$build/$exe" ] || { echo "[compare] missing $build/$exe" >&2; continue; }
      args=()
      case "$exe" in bench_train | bench_dp | bench_tp) args=(--seconds "$SECONDS_PER") ;; esac  # bench_pp: --steps
      echo "[compare] round $round, $side: $exe" >&2
      DISTJAX_BENCH_OUT="$OUT/$side.jsonl" timeout 900 "$build/$exe" "${args[@]}" >/dev/null 2>&1 ||
        echo "[compare] $side $exe failed" >&2
    done
  done
done
/usr/bin/python3 - "$OUT/A.jsonl" "$OUT/B.jsonl" "$A" "$B" <<'PY'
import json, statistics, sys
def load(path):
    runs = {}
    try:
        for line in open(path):
            r = json.loads(line)
            if isinstance(r.get("value"), (int, float)):
                runs.setdefault(r["name"], []).append((r["value"], r.get("unit", "")))
    except FileNotFoundError:
        pass
    return runs
a, b = load(sys.argv[1]), load(sys.argv[2])
print(f"{'name':58s} {'A':>14s} {'B':>14s} {'B/A':>7s}  unit   (A = {sys.argv[3]}, B = {sys.argv[4]}, medians)")
for name in sorted(set(a) | set(b)):
    va = statistics.median(v for v, _ in a[name]) if name in a else float("nan")
    vb = statistics.median(v for v, _ in b[name]) if name in b else float("nan")
    unit = (a.get(name) or b.get(name))[0][1]
    ratio = vb / va if va else float("nan")
    print(f"{name:58s} {va:14.4g} {vb:14.4g} {ratio:7.3f}  {unit}")
PY
