#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ built in BUILD (make fuzz): for each, first every input
# of its fuzz/corpus/<name>/regressions/ once, then fuzzing for SECONDS on its corpus (the
# seeds of the repository, read only, and BUILD/fuzz-corpus/<name>, which keeps what the runs
# find). Any crash, sanitizer report or escaping exception fails it; the input is left in
# BUILD/fuzz-artifacts/. Prints each target's executions.
#   bash scripts/fuzz.sh build-fuzz 60 config safetensors checkpoint_index
# With FUZZ_RUNS=N set, each target runs N executions from seed 1 instead of SECONDS (CI:
# on a fresh build directory the run is the same every time, so it passes there when it
# passed here; a run of random length could meet a new finding in CI first).
set -euo pipefail
BUILD=$1
SECONDS_PER_TARGET=$2
shift 2
export OMP_WAIT_POLICY=passive
# A UB report already aborts (-fno-sanitize-recover); these make leaks no finding (the
# library keeps process-wide caches) and print the stack of any report.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$BUILD/fuzz-artifacts"
summary=()
for name in "$@"; do
  bin="$BUILD/fuzz/${name}_fuzzer"
  seeds="fuzz/corpus/$name"
  regressions=("$seeds"/regressions/*)
  if [ -e "${regressions[0]}" ]; then
    echo "[fuzz] $name: ${#regressions[@]} regression inputs"
    if ! "$bin" "${regressions[@]}" >"$BUILD/fuzz-artifacts/$name-regressions.log" 2>&1; then
      tail -n 40 "$BUILD/fuzz-artifacts/$name-regressions.log"
      echo "[fuzz] $name: a regression input FAILED"
      exit 1
    fi
  fi
  mkdir -p "$BUILD/fuzz-corpus/$name"
  log="$BUILD/fuzz-artifacts/$name.log"
  if [ -n "${FUZZ_RUNS:-}" ]; then
    length=(-runs="$FUZZ_RUNS" -seed=1)
    what="$FUZZ_RUNS executions from seed 1"
  else
    length=(-max_total_time="$SECONDS_PER_TARGET")
    what="${SECONDS_PER_TARGET} s"
  fi
  echo "[fuzz] $name: $what on $seeds"
  start=$(date +%s)
  if ! "$bin" "${length[@]}" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$BUILD/fuzz-artifacts/$name-" \
      "$BUILD/fuzz-corpus/$name" "$seeds" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "[fuzz] $name: FAILED (input in $BUILD/fuzz-artifacts/, log $log)"
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  summary+=("$name: $runs executions in $(($(date +%s) - start)) s, no finding")
done
printf '[fuzz] %s\n' "${summary[@]}"
