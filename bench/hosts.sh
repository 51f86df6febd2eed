#!/usr/bin/env bash
# Benchmarks across hosts made of network namespaces (scripts/hosts.sh; needs root), each
# against its reference measured in the same run, appended to DISTJAX_BENCH_OUT:
#   hosts2_all_reduce_busbw_64MiB (and _4MiB, the 4-byte latency): DistJax's MPI backend
#     between 2 hosts, one rank each, over TCP, against raw MPI_Allreduce between the same
#     two ranks (bench_comm);
#   hosts2_gpt3d_tokens_per_s_vs_one_host: the main job (configs/gpt_3d.toml) on 2 hosts x 4
#     ranks against the same 8 ranks under mpirun on one host.
#
#   bash bench/hosts.sh [BUILD_DIR]    (bench/run.sh calls it as root)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
OUT=${DISTJAX_BENCH_OUT:-$ROOT/bench/results/latest.jsonl}
export DISTJAX_BENCH_OUT=$OUT
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
STEPS=${BENCH_HOSTS_STEPS:-60}
cd "$ROOT"
work=$(mktemp -d /tmp/distjax-bench-hosts.XXXXXX)
trap 'bash scripts/hosts.sh down; rm -rf "$work"' EXIT

bash scripts/hosts.sh up 2
DISTJAX_BENCH_HOSTS=2 timeout 600 bash scripts/hosts.sh mpirun 1 "$BUILD/bench_comm" >"$work/comm.log" 2>&1 ||
  { tail -5 "$work/comm.log" >&2; exit 1; }
grep '"name"' "$work/comm.log" || true

main_job() {  # main_job NAME LAUNCHER...: the main job's tokens/s after its first 10 steps
  local name=$1
  shift
  "$@" "$BUILD/distjax" train configs/gpt_3d.toml --overwrite --set run.steps="$STEPS" \
    --set run.log_every=10 --set run.eval_every=0 --set run.checkpoint_every=0 \
    --set run.timeline=false --out "$work/$name" >"$work/$name.log" 2>&1 ||
    { tail -5 "$work/$name.log" >&2; exit 1; }
}
main_job hosts bash scripts/hosts.sh mpirun 4
main_job one_host mpirun --allow-run-as-root --oversubscribe -np 8 -x OMP_WAIT_POLICY
/usr/bin/python3 - "$work/hosts/metrics.jsonl" "$work/one_host/metrics.jsonl" "$OUT" "$STEPS" <<'PY'
import json, sys, tomllib
def tokens_per_s(path):
    config = tomllib.load(open(path.replace("metrics.jsonl", "config.toml"), "rb"))
    tokens_per_step = config["run"]["batch_size"] * config["data"]["seq_len"]
    rows = [json.loads(l) for l in open(path) if '"loss"' in l]
    first, last = rows[0], rows[-1]  # the steps after the first logged one, timed
    return tokens_per_step * (last["step"] - first["step"]) / (last["elapsed_s"] - first["elapsed_s"])
hosts, one = tokens_per_s(sys.argv[1]), tokens_per_s(sys.argv[2])
rec = {"name": "hosts2_gpt3d_tokens_per_s_vs_one_host", "value": hosts, "unit": "tokens/s",
       "baseline": "8 ranks under mpirun on one host", "baseline_value": one, "better": "higher",
       "ratio": hosts / one, "steps": int(sys.argv[4]),
       "note": "configs/gpt_3d.toml, 2 hosts (network namespaces, OpenMPI over TCP) x 4 ranks "
               "against 8 ranks on one host (shared memory); tokens per second between the "
               "first logged step and the last"}
open(sys.argv[3], "a").write(json.dumps(rec) + "\n")
print(json.dumps(rec))
PY
