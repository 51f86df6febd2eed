#!/usr/bin/env bash
# The GPU benchmark (`make bench-gpu`, on the GPU machine after scripts/gpu-machine.sh has
# built there): GPT-2 124M bf16 training through DistJax's CUDA backend, its GEMMs against
# raw cuBLASLt (bench_gpu_gemm), communication of simulated devices on the GPU
# (bench_gpu_comm), the cost of simulating the (2,2,2) mesh there, and, in the same
# run, its references at the same batch: PyTorch eager and torch.compile
# (bench/reference/torch_gpt2.py) and JAX jit (bench/reference/jax_gpt2.py). Writes one JSON
# object per line to bench/results/gpu-latest.jsonl (the first line: card, date, commit)
# and prints them.
#
# The same losses from the same weights: the DistJax run writes its initial weights
# (safetensors) and the batches of its first GPU_LOSS_STEPS steps (.npy) and records those
# steps' losses (gpu_gpt2_124m_losses); each reference loads both (WEIGHTS=, TOKENS=,
# LOSS_STEPS=), trains those steps first and prints its own (torch_{eager,compile}_... and
# jax_jit_gpt2_124m_losses). gpu_gpt2_124m_loss_vs_{torch,torch_compile,jax}_max_rel: the
# largest |ours - theirs| / |theirs| over the steps (goal 2e-2: bf16 against autocast or
# bf16 casts). Then an f32 run of both at GPU_F32_BATCH, DistJax against torch eager without
# autocast or TF32 (bench_gpu_gpt2 --precision f32; PRECISION=f32):
# gpu_gpt2_124m_f32_loss_vs_torch_max_rel, goal 1e-4.
#
#   bash bench/gpu.sh [BUILD_DIR]     (default: build-gpu)
#   GPU_BATCH=16      the batch of every comparison
#   GPU_STEPS=20      timed steps (after warm-up) of each system
#   GPU_SKIP_REFS=1   DistJax alone
#   GPU_SKIP_SIM=1    without the (2,2,2) simulated mesh against one device
#   GPU_SKIP_VARIANTS=1  without the step under the settings off by default
#   GPU_DEADLINE=S    skip what would start after S seconds of this script (a lease's end)
#   GPU_LOSS_STEPS=20 the steps whose losses are compared (0: no comparison)
#   GPU_F32_BATCH=8   the batch of the f32 comparison
#   GPU_SKIP_F32=1    without the f32 comparison
#   GPU_LOSS_DIR=DIR  keep the weights, tokens and f32 lines there (default: a temporary dir)
#   DISTJAX_COMMIT=.. the commit recorded in the first line (default: git's HEAD)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-build-gpu}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
B="${GPU_BATCH:-16}"
STEPS="${GPU_STEPS:-20}"
LOSS_STEPS="${GPU_LOSS_STEPS:-20}"
F32_B="${GPU_F32_BATCH:-8}"
if [ -n "${GPU_LOSS_DIR:-}" ]; then
  LOSS_DIR=$GPU_LOSS_DIR; mkdir -p "$LOSS_DIR"
else
  LOSS_DIR=$(mktemp -d); trap 'rm -rf "$LOSS_DIR"' EXIT
fi
DEADLINE="${GPU_DEADLINE:-100000}"
OUT="$ROOT/bench/results/gpu-latest.jsonl"
mkdir -p "$ROOT/bench/results"
T0=$(date +%s)
PY=python3

log() { echo "[bench-gpu] $*" >&2; }
late() { [ $(($(date +%s) - T0)) -ge "$DEADLINE" ]; }
# note NAME REASON: a measurement that could not be made, and why.
note() {
  $PY -c 'import json,sys; print(json.dumps({"name": sys.argv[1], "value": None, "reason": sys.argv[2]}))' "$1" "$2" >>"$OUT"
  log "$1: $2"
}

card=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
# DISTJAX_COMMIT names the commit where the tree's git cannot (a copy made for the GPU
# machine may carry an older .git than its files).
commit=${DISTJAX_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}
$PY -c 'import json,sys; print(json.dumps({"name": "gpu_bench_run", "card": sys.argv[1], "date": sys.argv[2], "commit": sys.argv[3], "batch": int(sys.argv[4]), "seq": 1024, "model": "GPT-2 124M (L12 H12 d768 T1024 V50304), bf16, AdamW"}))' \
  "$card" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$commit" "$B" >"$OUT"

# DistJax; its initial weights and first batches for the references (LOSS_ARGS).
loss_args=(--loss-steps "$LOSS_STEPS")
[ "$LOSS_STEPS" -gt 0 ] && loss_args+=(--weights-out "$LOSS_DIR/weights.safetensors"
                                       --tokens-out "$LOSS_DIR/tokens.npy")
if [ -x "$BUILD/bench_gpu_gpt2" ]; then
  log "DistJax GPT-2 124M, batch $B"
  DISTJAX_BENCH_OUT="$OUT" "$BUILD/bench_gpu_gpt2" --batch "$B" --steps "$STEPS" "${loss_args[@]}" >/dev/null \
    || note gpu_gpt2_124m_tokens_per_s "bench_gpu_gpt2 failed (exit $?)"
else
  note gpu_gpt2_124m_tokens_per_s "no $BUILD/bench_gpu_gpt2: build first"
fi

# The references, each in the same run, from DistJax's weights and batches where it wrote
# them (their losses lines pass through as they are).
ref_env=(B="$B" STEPS="$STEPS" LOSS_STEPS="$LOSS_STEPS")
[ -s "$LOSS_DIR/weights.safetensors" ] && [ -s "$LOSS_DIR/tokens.npy" ] &&
  ref_env+=(WEIGHTS="$LOSS_DIR/weights.safetensors" TOKENS="$LOSS_DIR/tokens.npy")
if [ -z "${GPU_SKIP_REFS:-}" ]; then
  for mode in compile eager; do
    if late; then note "torch_$mode" "skipped: past the deadline"; continue; fi
    log "PyTorch $mode, batch $B"
    env "${ref_env[@]}" $PY "$ROOT/bench/reference/torch_gpt2.py" "$mode" 2>/dev/null |
      $PY -c 'import json,sys
for l in sys.stdin:
    j = json.loads(l)
    if "mode" in j: j["name"] = "torch_" + j["mode"] + "_gpt2_124m_tokens_per_s"; j["value"] = j["tok_s"]
    print(json.dumps(j))' >>"$OUT" || note "torch_$mode" "torch_gpt2.py failed"
  done
  if late; then note jax_jit "skipped: past the deadline"; else
    log "JAX jit, batch $B"
    env "${ref_env[@]}" $PY "$ROOT/bench/reference/jax_gpt2.py" 2>/dev/null |
      $PY -c 'import json,sys
for l in sys.stdin:
    j = json.loads(l)
    if "mode" in j: j["name"] = "jax_jit_gpt2_124m_tokens_per_s"; j["value"] = j["tok_s"]
    print(json.dumps(j))' \
      >>"$OUT" || note jax_jit "jax_gpt2.py failed"
  fi
fi

# The f32 losses: DistJax and torch eager (no autocast, no TF32), only the losses steps
# (bench_gpu_gpt2 times one step past them), their lines renamed *_f32_losses.
# f32_losses PREFIX FILE: FILE's losses line, renamed PREFIX_f32_losses, onto OUT.
f32_losses() {
  $PY -c 'import json,sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j.get("name", "").endswith("_losses"):
        j["name"] = sys.argv[2] + "_f32_losses"; print(json.dumps(j))' "$2" "$1" >>"$OUT"
}
if [ -z "${GPU_SKIP_REFS:-}" ] && [ -z "${GPU_SKIP_F32:-}" ] && [ "$LOSS_STEPS" -gt 0 ] &&
   [ -x "$BUILD/bench_gpu_gpt2" ] && ! late; then
  log "f32 losses of DistJax and PyTorch eager, batch $F32_B"
  if DISTJAX_BENCH_OUT="$LOSS_DIR/f32.jsonl" "$BUILD/bench_gpu_gpt2" --precision f32 --batch "$F32_B" \
       --warmup 0 --steps 1 --profile-steps 0 --loss-steps "$LOSS_STEPS" \
       --weights-out "$LOSS_DIR/weights_f32.safetensors" --tokens-out "$LOSS_DIR/tokens_f32.npy" >/dev/null; then
    f32_losses gpu_gpt2_124m "$LOSS_DIR/f32.jsonl"
    PRECISION=f32 STEPS=0 LOSS_STEPS="$LOSS_STEPS" WEIGHTS="$LOSS_DIR/weights_f32.safetensors" \
      TOKENS="$LOSS_DIR/tokens_f32.npy" $PY "$ROOT/bench/reference/torch_gpt2.py" eager \
      >"$LOSS_DIR/torch_f32.jsonl" 2>/dev/null && f32_losses torch_eager_gpt2_124m "$LOSS_DIR/torch_f32.jsonl" \
      || note torch_eager_gpt2_124m_f32_losses "torch_gpt2.py PRECISION=f32 failed"
  else
    note gpu_gpt2_124m_f32_losses "bench_gpu_gpt2 --precision f32 failed (exit $?)"
  fi
fi

# After the comparisons (a lease's end may cut what follows): the step under settings off by
# default, the GEMMs alone, communication, the simulated mesh.
# variant SUFFIX VAR=VALUE: the same step under one setting off by default, its line named
# gpu_gpt2_124m_tokens_per_s_SUFFIX.
variant() {
  local name=gpu_gpt2_124m_tokens_per_s_$1 setting=$2
  [ -x "$BUILD/bench_gpu_gpt2" ] && ! late && [ "${GPU_SKIP_VARIANTS:-0}" != 1 ] || return 0
  log "DistJax GPT-2 124M, batch $B, $setting"
  local tmp
  tmp=$(mktemp)
  if env "$setting" DISTJAX_BENCH_OUT="$tmp" "$BUILD/bench_gpu_gpt2" \
      --batch "$B" --steps "$STEPS" --profile-steps 0 >/dev/null; then
    $PY -c 'import json,sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j.get("name") == "gpu_gpt2_124m_tokens_per_s":
        j["name"] = sys.argv[2]; j["setting"] = sys.argv[3]; print(json.dumps(j))' \
      "$tmp" "$name" "$setting" >>"$OUT"
  else
    note "$name" "bench_gpu_gpt2 failed (exit $?)"
  fi
  rm -f "$tmp"
}
# cuDNN's attention backward in its default, non-deterministic algorithm (PyTorch's and
# JAX's fused attention default to theirs), and the GEMMs' algorithms chosen by timing
# cuBLASLt's candidates (a run's choice may differ from the next's).
variant gemm_tuned DISTJAX_CUDA_GEMM_TUNE=1
# The 16-bit QKV's bias gradient as a column sum beside a plain dW product, instead of inside
# the product (cuBLASLt's BGRADA): which of the two the default should be.
variant bias_grad_unfused DISTJAX_BIAS_GRAD_IN_PRODUCT=0
variant attention_nondeterministic DISTJAX_CUDA_ATTENTION_DETERMINISTIC=0

# The step's GEMMs through DistJax's matmul against raw cuBLASLt.
if [ -x "$BUILD/bench_gpu_gemm" ] && ! late; then
  log "GEMMs of the step vs raw cuBLASLt, batch $B"
  DISTJAX_BENCH_OUT="$OUT" "$BUILD/bench_gpu_gemm" --batch "$B" >/dev/null \
    || note gpu_gemm_vs_cublas "bench_gpu_gemm failed (exit $?)"
fi

# Simulated devices sharing the GPU: the threads backend's all-reduce against a plain
# device-to-device copy, and (where MPI is built and mpirun found) the MPI backend's staged
# all-reduce of device buffers against the same staged by hand.
if [ -x "$BUILD/bench_gpu_comm" ] && ! late; then
  log "all-reduce of 4 simulated devices on the GPU, 64 MiB"
  DISTJAX_BENCH_OUT="$OUT" "$BUILD/bench_gpu_comm" --devices 4 --mib 64 >/dev/null \
    || note gpu_threads_all_reduce_busbw_4dev_64MiB "bench_gpu_comm failed (exit $?)"
  if command -v mpirun >/dev/null 2>&1 && ldd "$BUILD/bench_gpu_comm" | grep -q libmpi; then
    log "all-reduce of 2 MPI processes' GPU buffers, 64 MiB"
    DISTJAX_BENCH_OUT="$OUT" mpirun --allow-run-as-root -np 2 "$BUILD/bench_gpu_comm" --mpi \
      --mib 64 >/dev/null || note gpu_mpi_all_reduce_busbw_2proc_64MiB "bench_gpu_comm --mpi failed"
  else
    note gpu_mpi_all_reduce_busbw_2proc_64MiB "no MPI in this build or no mpirun on this machine"
  fi
fi

# The cost of simulating the mesh: the 124M GPT on (data 2, model 2, pipe 2) simulated
# devices on this GPU against the same model and batch on one device of it (distjax train,
# configs/gpt2_124m_3d_gpu.toml; tokens/s: the median of the logged intervals after the first).
if [ -x "$BUILD/distjax" ] && [ -z "${GPU_SKIP_SIM:-}" ] && ! late; then
  SIM_STEPS=${GPU_SIM_STEPS:-30}
  for mesh in sim8 single; do
    extra=()
    [ $mesh = single ] && extra=(--set distributed.world_size=1 --set distributed.tensor_parallel_size=1
                                 --set distributed.pipeline_parallel_size=1)
    log "GPT-2 124M shape, $mesh, $SIM_STEPS steps"
    "$BUILD/distjax" train "$ROOT/configs/gpt2_124m_3d_gpu.toml" --set run.steps="$SIM_STEPS" \
      --set run.log_every=5 --set run.eval_every=0 --set run.timeline=false \
      --set run.batch_size="$B" "${extra[@]}" --out "/tmp/distjax-bench-$mesh" --overwrite \
      >"/tmp/distjax-bench-$mesh.log" 2>&1 || note "gpu_gpt2_124m_3d_$mesh" "distjax train failed: $(tail -n 2 "/tmp/distjax-bench-$mesh.log" | tr '\n' ' ' | cut -c1-300)"
  done
  $PY - "$OUT" /tmp/distjax-bench-sim8 /tmp/distjax-bench-single <<'EOF2'
import json, os, statistics, sys
out, runs = sys.argv[1], {"sim8": sys.argv[2], "single": sys.argv[3]}
tput = {}
for mesh, d in runs.items():
    path = os.path.join(d, "metrics.jsonl")
    if not os.path.exists(path):
        continue
    vals = [r["throughput"] for r in map(json.loads, open(path)) if r.get("throughput")]
    if len(vals) > 1:
        tput[mesh] = statistics.median(vals[1:])
lines = [{"name": "gpu_gpt2_124m_3d_" + m + "_tokens_per_s", "value": v, "unit": "tokens/s"}
         for m, v in tput.items()]
if len(tput) == 2:
    lines.append({"name": "gpu_sim8_gpt2_124m_3d_vs_single", "value": tput["sim8"] / tput["single"],
                  "unit": "ratio", "reference": "gpu_gpt2_124m_3d_single_tokens_per_s"})
else:
    lines.append({"name": "gpu_sim8_gpt2_124m_3d_vs_single", "value": None, "reason": "a run failed"})
with open(out, "a") as f:
    for l in lines:
        f.write(json.dumps(l) + "\n")
EOF2
fi

# The ratios, from the lines above.
$PY - "$OUT" <<'EOF'
import json, sys
path = sys.argv[1]
lines = [json.loads(l) for l in open(path)]
by = {l["name"]: l for l in lines}
ours = by.get("gpu_gpt2_124m_tokens_per_s", {}).get("value")
nondet = by.get("gpu_gpt2_124m_tokens_per_s_attention_nondeterministic", {}).get("value")
tuned = by.get("gpu_gpt2_124m_tokens_per_s_gemm_tuned", {}).get("value")
unfused = by.get("gpu_gpt2_124m_tokens_per_s_bias_grad_unfused", {}).get("value")
out = []
for ref, name, mine in [
        ("torch_compile_gpt2_124m_tokens_per_s", "gpu_gpt2_124m_vs_torch_compile", ours),
        ("torch_eager_gpt2_124m_tokens_per_s", "gpu_gpt2_124m_vs_torch_eager", ours),
        ("jax_jit_gpt2_124m_tokens_per_s", "gpu_gpt2_124m_vs_jax_jit", ours),
        ("torch_compile_gpt2_124m_tokens_per_s",
         "gpu_gpt2_124m_vs_torch_compile_attention_nondeterministic", nondet),
        ("torch_compile_gpt2_124m_tokens_per_s", "gpu_gpt2_124m_vs_torch_compile_gemm_tuned",
         tuned),
        ("torch_compile_gpt2_124m_tokens_per_s",
         "gpu_gpt2_124m_vs_torch_compile_bias_grad_unfused", unfused)]:
    theirs = by.get(ref, {}).get("value")
    if mine and theirs:
        out.append({"name": name, "value": mine / theirs, "unit": "ratio", "reference": ref})
    else:
        out.append({"name": name, "value": None, "reason": "a side is missing"})
# Peak memory measured the same way: the allocator's reserved high-water mark from the first
# step (DistJax: its pool's; PyTorch: max_memory_reserved), ours over theirs (lower is less).
for ref, name in [("torch_compile_gpt2_124m_tokens_per_s", "gpu_gpt2_124m_reserved_peak_vs_torch_compile"),
                  ("torch_eager_gpt2_124m_tokens_per_s", "gpu_gpt2_124m_reserved_peak_vs_torch_eager")]:
    mine = by.get("gpu_gpt2_124m_tokens_per_s", {}).get("reserved_peak_gib")
    theirs = by.get(ref, {}).get("reserved_peak_gib")
    if mine and theirs:
        out.append({"name": name, "value": mine / theirs, "unit": "ratio", "distjax_gib": mine,
                    "reference_gib": theirs, "reference": ref,
                    "measure": "reserved high-water mark from the first step"})
    else:
        out.append({"name": name, "value": None, "reason": "a side is missing"})
# The same losses from the same weights: max over the steps of |ours - theirs| / |theirs|.
for mine, ref, name, goal in [
        ("gpu_gpt2_124m_losses", "torch_eager_gpt2_124m_losses", "gpu_gpt2_124m_loss_vs_torch_max_rel", 2e-2),
        ("gpu_gpt2_124m_losses", "torch_compile_gpt2_124m_losses",
         "gpu_gpt2_124m_loss_vs_torch_compile_max_rel", 2e-2),
        ("gpu_gpt2_124m_losses", "jax_jit_gpt2_124m_losses", "gpu_gpt2_124m_loss_vs_jax_max_rel", 2e-2),
        ("gpu_gpt2_124m_f32_losses", "torch_eager_gpt2_124m_f32_losses",
         "gpu_gpt2_124m_f32_loss_vs_torch_max_rel", 1e-4)]:
    a, b = by.get(mine, {}).get("losses"), by.get(ref, {}).get("losses")
    n = min(len(a), len(b)) if a and b else 0
    if n:
        rel = [abs(x - y) / abs(y) for x, y in zip(a[:n], b[:n])]
        out.append({"name": name, "value": max(rel), "unit": "relative", "goal": goal,
                    "met": max(rel) <= goal, "steps": n, "worst_step": rel.index(max(rel)),
                    "reference": ref})
    else:
        out.append({"name": name, "value": None, "goal": goal, "reason": "a side's losses are missing"})
with open(path, "a") as f:
    for o in out:
        f.write(json.dumps(o) + "\n")
for l in lines + out:
    print(json.dumps(l))
EOF
