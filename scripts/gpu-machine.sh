#!/usr/bin/env bash
# shellcheck disable=SC2317  # the step functions are called through step()
# Builds DistJax with CUDA on the GPU machine and tests it: first the tests labelled "gpu",
# which must not skip there (DISTJAX_REQUIRE_GPU=1), then (ALL=1, the default) the whole
# suite, then (BENCH=1) the GPU benchmark, bench/gpu.sh. Logs and a summary go to
# ${OUT:-gpu-logs}/; the exit status is 0 only if every step passed.
#
# That machine (Ubuntu 24.04, g++ 13, CMake 4, ninja, nvcc under /usr/local/cuda, NCCL's
# runtime library, 16 cores) has no package registry and keeps nothing between uses. So:
#   here, once:  bash scripts/fetch-device-deps.sh     (fills .device-deps/)
#   there:       bash scripts/gpu-machine.sh [extra cmake -D options]
# with .device-deps/ carried along with the tree. The .deb files are unpacked into a prefix
# (${PREFIX:-/tmp/deps}), never into /, except the data packages (fortunes, Fashion-MNIST),
# which go to the default paths the programs read. The build is made there, so the
# library's -march=native is that machine's CPU; nothing built here is carried.
set -uo pipefail  # no -e: a failed step is recorded, and the next steps still run
cd "$(dirname "$0")/.." || exit 1
DEPS=${DEPS:-.device-deps}
PREFIX=${PREFIX:-/tmp/deps}
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT" "$PREFIX"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
failed=0

# step NAME COMMAND...: runs COMMAND with its output in $OUT/NAME.log, one line to the summary.
step() {
  local name=$1 start rc
  shift
  start=$(date +%s)
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  local line
  line="$name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)") in $(($(date +%s) - start)) s"
  echo "$line" | tee -a "$SUMMARY"
  [ $rc -eq 0 ] || failed=1
  return $rc
}

unpack() {
  local f
  compgen -G "$DEPS/*.deb" >/dev/null || {
    echo "no .deb files in $DEPS: run scripts/fetch-device-deps.sh where apt works, carry $DEPS"
    return 1
  }
  for f in "$DEPS"/*.deb; do
    case $f in
      *fortune* | *fashion*) dpkg -x "$f" / ;;
      # gdb's, in a prefix of their own, off LD_LIBRARY_PATH (see gdb_env).
      */gdb-minimal_* | */libipt2_* | */libreadline8_* | */libexpat1_* | */libxxhash0_*)
        dpkg -x "$f" "$PREFIX/gdb" ;;
      *) dpkg -x "$f" "$PREFIX" ;;
    esac
    echo "unpacked $f"
  done
}

configure() {
  local nccl=() mpi=(-DDISTJAX_WITH_MPI=OFF)
  # NCCL's header, carried, where the machine has only the library.
  if [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ] &&
    [ -f "$DEPS/nccl/include/nccl.h" ]; then
    nccl=(-DDISTJAX_NCCL_INCLUDE_DIR="$PWD/$DEPS/nccl/include")
  fi
  # OpenMPI where its .debs were carried. mpi_env's exports stay for the later steps (step
  # runs a function in this shell): mpirun and the MPI programs need them too. FindMPI asks
  # $PREFIX/usr/bin/mpicc for its flags, which are right only with OPAL_PREFIX set.
  if [ "${NO_MPI:-0}" != 1 ] && mpi_env; then
    mpi=(-DDISTJAX_WITH_MPI=ON -DMPI_HOME="$PREFIX/usr")
  fi
  # cuDNN's attention: the frontend's headers and cudnn.h, carried (that machine's cuDNN is
  # a pip package, its headers elsewhere); the library is found at run time (cudnn_env).
  local cudnn=()
  [ -f "$DEPS/cudnn-frontend/include/cudnn_frontend.h" ] &&
    cudnn+=(-DDISTJAX_CUDNN_FRONTEND_DIR="$PWD/$DEPS/cudnn-frontend/include")
  [ ! -f /usr/local/cuda/include/cudnn.h ] && [ -f "$DEPS/cudnn/include/cudnn.h" ] &&
    cudnn+=(-DDISTJAX_CUDNN_INCLUDE_DIR="$PWD/$DEPS/cudnn/include")
  local args=(-S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX/usr"
              -DDISTJAX_WITH_CUDA=ON "${nccl[@]}" "${cudnn[@]}" "$@")
  cmake "${args[@]}" "${mpi[@]}" && return 0
  # A relocated MPI that does not configure must not cost the GPU run: without it, said so.
  [ "${mpi[0]}" = -DDISTJAX_WITH_MPI=ON ] || return 1
  echo "-- DistJax: configuring with the carried OpenMPI failed; configuring again without MPI"
  rm -rf "$BUILD"
  cmake "${args[@]}" -DDISTJAX_WITH_MPI=OFF
}

# The tests labelled gpu, which fail instead of skipping when they find no GPU.
ctest_gpu() {
  (cd "$BUILD" && DISTJAX_REQUIRE_GPU=1 ctest --output-on-failure --timeout 600 -L '^gpu$')
}

# The whole suite, but the loss-curve plot needs gnuplot, which that machine lacks.
ctest_all() {
  local skip=()
  if ! command -v gnuplot >/dev/null; then
    echo "gnuplot is not installed: PlotLossCurve is left out"
    skip=(-E '^PlotLossCurve\.')
  fi
  (cd "$BUILD" && ctest --output-on-failure -j "$(nproc)" --timeout 600 "${skip[@]}")
}

export LD_LIBRARY_PATH=$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# OpenMPI 4.1 unpacked into $PREFIX looks for its files under /usr and /etc unless told where
# it is; one machine, no ssh, no fabric libraries. Returns 1 where its .debs were not carried.
# (libmpi.so.40 and the libraries it loads are in $PREFIX/usr/lib/x86_64-linux-gnu, already on
# LD_LIBRARY_PATH; .../openmpi/lib holds only the -dev links the build links against.)
mpi_env() {
  [ -x "$PREFIX/usr/bin/orterun" ] || return 1
  local n cap
  # dpkg -x makes no alternatives links: the names FindMPI, the tests and bench/ look for.
  for n in mpirun mpiexec mpicc mpicxx; do ln -sfn "$n.openmpi" "$PREFIX/usr/bin/$n"; done
  export PATH=$PREFIX/usr/bin:$PATH
  export OPAL_PREFIX=$PREFIX/usr              # mpicc's wrapper data, headers, plugins
  export OPAL_SYSCONFDIR=$PREFIX/etc/openmpi  # Debian's openmpi-mca-params.conf: no ucx, ofi, openib
  export PMIX_INSTALL_PREFIX=$PREFIX/usr/lib/x86_64-linux-gnu/pmix2
  export PMIX_MCA_mca_base_component_path=$PMIX_INSTALL_PREFIX/lib/pmix  # its .conf names /usr
  export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated}  # local ranks only; rsh aborts mpirun without ssh
  # ob1 over shared memory: the mtls (psm, psm2, ofi) and netlink would want libraries not
  # carried, and print an error line from every rank.
  export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
  export OMPI_MCA_reachable=${OMPI_MCA_reachable:-^netlink}
  # vader copies large messages with process_vm_readv, which a container without CAP_SYS_PTRACE
  # (Docker's default seccomp profile) refuses mid-run ("Read -1, expected ..., errno = 1").
  cap=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
  if (( ((16#${cap:-0} >> 19) & 1) == 0 )); then
    export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
  fi
}
# gdb, for the threads' backtraces of a run that hangs: the machine's own, or Debian's
# gdb-minimal where it was carried (unpacked into $PREFIX/gdb), run through a wrapper,
# $PREFIX/gdb/bin/gdb, put first on PATH. Its libraries stay off the global LD_LIBRARY_PATH:
# bookworm's expat and readline would shadow the machine's newer ones for every program.
# libdebuginfod.so.1 is a stub built here: the real one wants libcurl-gnutls and its chain, for
# a lookup gdb makes only with DEBUGINFOD_URLS set, which the wrapper empties. Returns 1 where
# there is no gdb that runs.
gdb_env() {
  command -v gdb >/dev/null && return 0
  local g=$PREFIX/gdb
  local lib=$g/usr/lib/x86_64-linux-gnu
  [ -x "$g/usr/bin/gdb" ] || return 1
  mkdir -p "$lib" "$g/bin"
  if [ ! -f "$lib/libdebuginfod.so.1" ]; then
    printf '%s\n' 'ELFUTILS_0.178 { global: debuginfod_begin; debuginfod_end; debuginfod_find_debuginfo;' \
      'debuginfod_find_executable; debuginfod_find_source; debuginfod_set_progressfn; local: *; };' \
      'ELFUTILS_0.179 { global: debuginfod_get_user_data; debuginfod_set_user_data; } ELFUTILS_0.178;' \
      >"$g/debuginfod.map"
    printf '%s\n' '#define F(n) int n(void) { return -38; }' 'void *debuginfod_begin(void) { return 0; }' \
      'void *debuginfod_get_user_data(void) { return 0; }' 'F(debuginfod_end) F(debuginfod_find_debuginfo)' \
      'F(debuginfod_find_executable) F(debuginfod_find_source) F(debuginfod_set_progressfn)' \
      'F(debuginfod_set_user_data)' |
      gcc -shared -fPIC -x c - -o "$lib/libdebuginfod.so.1" -Wl,-soname,libdebuginfod.so.1 \
        -Wl,--version-script="$g/debuginfod.map" || return 1
  fi
  printf '%s\n' '#!/bin/sh' \
    "LD_LIBRARY_PATH=$lib:$g/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} DEBUGINFOD_URLS= \\" \
    "  exec $g/usr/bin/gdb \"\$@\"" >"$g/bin/gdb"
  chmod +x "$g/bin/gdb"
  export PATH=$g/bin:$PATH
  gdb --version >/dev/null
}
# libcudnn.so.9 for cuDNN's attention (loaded at run time): the toolkit's, else the pip
# package nvidia-cudnn-cu13's (DISTJAX_CUDNN_LIBRARY, and its folder on LD_LIBRARY_PATH for
# the libraries it loads). Found, the tests require it (DISTJAX_REQUIRE_CUDNN=1).
cudnn_env() {
  local lib=""
  if [ -f /usr/local/cuda/lib64/libcudnn.so.9 ]; then
    lib=/usr/local/cuda/lib64/libcudnn.so.9
  else
    local dir
    dir=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null) &&
      [ -f "$dir/lib/libcudnn.so.9" ] && lib=$dir/lib/libcudnn.so.9
  fi
  [ -n "$lib" ] || { echo "cudnn: no libcudnn.so.9 found (the own attention kernels run)"; return 1; }
  export DISTJAX_CUDNN_LIBRARY=$lib DISTJAX_REQUIRE_CUDNN=1
  export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "cudnn: $lib"
}
export OMP_WAIT_POLICY=passive
{
  date
  nvidia-smi || true
  nvcc --version || /usr/local/cuda/bin/nvcc --version || true
  g++ --version | head -1
  cmake --version | head -1
  lscpu | grep -E 'Model name|^CPU\(s\)' || true
} >"$OUT/machine.txt" 2>&1

step unpack unpack >/dev/null || exit 1
mv "$OUT/unpack.log" /tmp/ 2>/dev/null
# In this shell: gdb_env's PATH stays for the later steps.
if gdb_env >/tmp/gdb-env.log 2>&1; then gdb_line="gdb: $(gdb --version | head -n 1)"
else gdb_line="gdb: none$(tail -n 1 /tmp/gdb-env.log | sed 's/^./ (&/; s/.$/&)/')"; fi
echo "$gdb_line" | tee -a "$SUMMARY"
cudnn_env >/tmp/cudnn-env.txt  # in this shell: its exports stay for the later steps
tee -a "$SUMMARY" </tmp/cudnn-env.txt
step configure configure "$@" || exit 1
grep -E '^-- DistJax:|configuring again' "$OUT/configure.log" | tee -a "$SUMMARY"
# At most 8 files come back from the GPU machine: a configure that passed keeps only the
# lines above.
mv "$OUT/configure.log" /tmp/ 2>/dev/null
# QUICK=1: only the library, the gpu tests and the GPU benchmarks are built, and the gpu
# tests run as programs (a lease's minutes go to the GPU, not to building the suite).
# With them, the parity tests of every strategy that the gpu_* ctest entries rerun with the
# simulated devices sharing the GPU (tests/CMakeLists.txt, distjax_gpu_run), and the main job.
GPU_PROGRAMS=()
for f in tests/gpu/*_test.cpp; do GPU_PROGRAMS+=("$(basename "$f" .cpp)"); done
QUICK_TARGETS=(distjax "${GPU_PROGRAMS[@]}" bench_gpu_gpt2 bench_gpu_gemm
               bench_gpu_comm distjax_tool run_on_gpu device_buffers_test collectives_test
               ppermute_test data_parallel_test zero_test fsdp_test tensor_parallel_test
               tp_async_test pipeline_test gpt_parity_test distjax_moe_test)
# With MPI: the SPMD and parity programs that ctest's gpu_*_mpi entries run under mpirun.
grep -q 'MPI backend ON' "$SUMMARY" &&
  QUICK_TARGETS+=(spmd_mpi_test pipeline_mpi_test tensor_parallel_mpi_test global_view_mpi_test)
gpu_programs() {
  local t rc=0
  for t in "${GPU_PROGRAMS[@]}"; do
    echo "== $t"
    DISTJAX_REQUIRE_GPU=1 timeout 600 "$BUILD/tests/$t" || rc=1
  done
  # With PROBE_SPMD_MPI=1 the probe below runs gpu_spmd_mpi's program (capped at 45 s), and
  # SKIP_SPMD_MPI=1 leaves it out: where it hangs, its ctest entry holds the lease for 300 s.
  local skip=()
  [ "${PROBE_SPMD_MPI:-0}" != 0 ] || [ "${SKIP_SPMD_MPI:-0}" = 1 ] && skip=(-E '^gpu_spmd_mpi$')
  echo "== the strategies' parity tests and the main job on the GPU (ctest -R '^gpu_' ${skip[*]})"
  (cd "$BUILD" && DISTJAX_REQUIRE_GPU=1 ctest --output-on-failure --timeout 900 -R '^gpu_' "${skip[@]}") || rc=1
  echo "== the main job's summary on the GPU (memory per device, bubble; timeline.json beside it)"
  cat "$BUILD/tests/gpu_main_job/summary.json"
  echo
  echo "== margins of the pipeline parity tests on the GPU (DISTJAX_PARITY_REPORT=1)"
  DISTJAX_DEVICE=cuda DISTJAX_PARITY_REPORT=1 "$BUILD/tests/pipeline_test" \
    --gtest_filter='Pipeline.FullyShardedStagesMatchOneDevice:Pipeline.GptDataTensorPipe222*' 2>&1 |
    grep -E '^\[parity\]|OK \]|FAILED \]' | sort -t= -k2 -g | tail -n 8
  return $rc
}
build_quick() { cmake --build "$BUILD" -j "$(nproc)" --target "${QUICK_TARGETS[@]}"; }
if [ "${QUICK:-0}" = 1 ]; then
  if ! step build build_quick; then
    # A carried MPI that configured but does not build must not cost the GPU run.
    grep -q 'MPI backend ON' "$SUMMARY" || exit 1
    mv "$OUT/build.log" "$OUT/build-with-mpi.log"
    rm -rf "$BUILD"
    NO_MPI=1 step configure-without-mpi configure "$@" || exit 1
    local_targets=()
    for t in "${QUICK_TARGETS[@]}"; do [[ $t == *_mpi_test ]] || local_targets+=("$t"); done
    QUICK_TARGETS=("${local_targets[@]}")
    step build build_quick || exit 1
  fi
  [ "${TESTS:-1}" = 1 ] && step gpu-tests gpu_programs
else
  step build cmake --build "$BUILD" -j "$(nproc)" || exit 1
  step ctest-gpu ctest_gpu
fi
# PROBE_SPMD_MPI=1: the SPMD programs under mpirun -np 4 on the GPU once, each line tagged
# with its rank, capped at 45 s (a report: what each rank says when the run does not end).
# Ranks still running after 30 s get their threads' backtraces (gdb, attached to all at once,
# 20 s each) and their threads' kernel wait channels (no ptrace needed), after the run's output.
# backtrace_probe PROGRAM LOG [ARGS...]: PROGRAM under mpirun -np 4 on the GPU, capped at 45 s;
# processes still running after 30 s get their threads' backtraces (gdb, attached to all at
# once, 20 s each) and their threads' kernel wait channels (no ptrace needed), appended to LOG.
backtrace_probe() {
  local program=$1 log=$2
  shift 2
  timeout -s INT 45 mpirun --allow-run-as-root --oversubscribe --tag-output -x DISTJAX_DEVICE=cuda \
    -x LD_LIBRARY_PATH -np 4 "$BUILD/tests/$program" "$@" >"$log" 2>&1 &
  local probe=$! dumps p pid t
  for _ in $(seq 30); do kill -0 "$probe" 2>/dev/null && sleep 1; done
  dumps=$(mktemp -d)
  for p in /proc/[0-9]*; do  # not pgrep: procps may be missing there
    [ "$(cat "$p/comm" 2>/dev/null)" = "${program:0:15}" ] || continue
    pid=${p#/proc/}
    {
      echo "==== process $pid: threads (name, wait channel)"
      for t in "$p"/task/*; do echo "${t##*/} $(cat "$t/comm") $(cat "$t/wchan")"; done
      if command -v gdb >/dev/null; then
        echo "==== gdb -p $pid -batch -ex 'thread apply all bt'"
        timeout 20 gdb -p "$pid" -batch -ex 'thread apply all bt' </dev/null 2>&1
      fi
    } >"$dumps/$pid" 2>&1 &
  done
  wait "$probe"
  echo "backtrace-probe $program: exit $?" | tee -a "$SUMMARY"
  wait  # the dumps
  cat "$dumps"/* >>"$log" 2>/dev/null
  rm -rf "$dumps"
}
if [ "${PROBE_SPMD_MPI:-0}" = 1 ] && [ -x "$BUILD/tests/spmd_mpi_test" ]; then
  backtrace_probe spmd_mpi_test "$OUT/spmd-mpi-probe.log"
fi
# probe_variant LABEL NP PROGRAM [VAR=VALUE...] [-- args]: PROGRAM under mpirun -np NP on the
# GPU, capped at PROBE_CAP seconds (default 25), one summary line (exit 0: it passed; 124: it
# hung), its output in spmd-mpi-variants.LABEL.log.
probe_variant() {  # LABEL NP PROGRAM [VAR=VALUE...] [-- args]
  local label=$1 np=$2 program=$3 envs=() args=()
  shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=(-x "$1"); shift; done
  [ "${1:-}" = -- ] && { shift; args=("$@"); }
  local t0=$SECONDS
  timeout -s INT "${PROBE_CAP:-25}" mpirun --allow-run-as-root --oversubscribe --tag-output -x DISTJAX_DEVICE=cuda \
    -x LD_LIBRARY_PATH "${envs[@]}" -np "$np" "$BUILD/tests/$program" "${args[@]}" \
    >"$OUT/spmd-mpi-variants.$label.log" 2>&1
  local rc=$?
  echo "spmd-mpi-variant $label: exit $rc in $((SECONDS - t0)) s" | tee -a "$SUMMARY"
  return $rc
}
# PROBE_SPMD_MPI=4: several processes sharing the GPU (docs/spmd.md, "On a GPU the launch
# orders its edges"): gpu_spmd_mpi's program and four processes of collectives_test, each
# twice, capped at 20 s; where all pass, the gpu_spmd_mpi ctest entry itself; where one
# fails, its failures and the processes' backtraces.
if [ "${PROBE_SPMD_MPI:-0}" = 4 ] && [ -x "$BUILD/tests/collectives_test" ]; then
  PROBE_CAP=20
  ok=1
  for i in 1 2; do
    probe_variant "spmd-mpi-$i" 4 spmd_mpi_test || ok=0
    probe_variant "threads-x4-$i" 4 collectives_test -- --gtest_brief=1 || ok=0
  done
  if [ $ok = 1 ]; then
    step ctest-gpu-spmd-mpi bash -c "cd '$BUILD' && DISTJAX_REQUIRE_GPU=1 ctest --output-on-failure --timeout 90 -R '^gpu_spmd_mpi\$'"
  else
    grep -ah 'FAILED  \]\|max |diff|\|exception' "$OUT"/spmd-mpi-variants.*.log | sort | uniq -c |
      sort -rn | head -n 12 | tee -a "$SUMMARY"
    backtrace_probe collectives_test "$OUT/spmd-mpi-probe.log" --gtest_brief=1
  fi
fi
if [ "${PROBE_SPMD_MPI:-0}" -ge 2 ]; then
  # One file back: the last lines of each (at most 8 files return from the machine).
  for f in "$OUT"/spmd-mpi-variants.*.log; do
    echo "==== ${f##*/}"
    tail -n 25 "$f"
  done >"$OUT/spmd-mpi-variants.log" 2>/dev/null
  rm -f "$OUT"/spmd-mpi-variants.*.log
fi
# RERUN=1: one-device test binaries rerun with every tensor on the GPU (DISTJAX_DEVICE=cuda)
# against their own CPU-computed expectations; a report, not a gate (some tests compare
# bits that a GPU's summation order changes).
if [ "${RERUN:-0}" = 1 ]; then
  (for t in tensor_test ops_grad_test nn_ops_test kernels_test attention_packed_test \
            matmul_mixed_test inplace_ops_test parallel_ops_test optim_test clip_test \
            train_step_test initializers_test classifier_test; do
     [ -x "$BUILD/tests/$t" ] || continue
     DISTJAX_DEVICE=cuda timeout 300 "$BUILD/tests/$t" --gtest_brief=1 2>&1 | tail -n 60 |
       sed "s/^/[$t] /"
   done) >"$OUT/cuda-reruns.log" 2>&1
  echo "cuda-reruns: $(grep -c 'FAILED  \]' "$OUT/cuda-reruns.log") failed test lines" | tee -a "$SUMMARY"
fi
[ "${ALL:-1}" = 1 ] && [ "${QUICK:-0}" != 1 ] && step ctest-all ctest_all
if [ "${BENCH:-0}" = 1 ]; then
  step bench-gpu bash bench/gpu.sh "$BUILD"
  cp bench/results/gpu-latest.jsonl "$OUT/" 2>/dev/null
fi
# BREAK=1, last (it leaves the build broken): the device-to-device reduction of the threads
# backend made to drop its last rank, the library rebuilt, and the parity reruns that go
# through it run again. They must fail; the step passes only if they do.
break_all_reduce() {
  sed -i 's/for (int j = 1; j < k; ++j)/for (int j = 1; j < k - 1; ++j)/' src/distjax/tensor/cuda/comm.cu
  grep -c 'j < k - 1' src/distjax/tensor/cuda/comm.cu
  cmake --build "$BUILD" -j "$(nproc)" --target distjax data_parallel_test collectives_test zero_test \
    || return 1
  if (cd "$BUILD" && DISTJAX_REQUIRE_GPU=1 ctest --output-on-failure --timeout 300 \
        -R '^gpu_(parallel_dp|spmd_collectives|parallel_zero)$'); then
    echo "the parity reruns passed with a broken all-reduce: they do not guard it"
    return 1
  fi
  echo "the parity reruns failed with the all-reduce broken, as they must"
}
[ "${BREAK:-0}" = 1 ] && step break-all-reduce break_all_reduce

# What a caller reading only the end of the output needs: the summary, the failures of the
# gpu tests, and the benchmark's lines.
{
  echo "==== summary"
  cat "$SUMMARY"
  if [ -f "$OUT/gpu-tests.log" ]; then
    echo "==== gpu tests: failures and golden runs"
    grep -E -A4 'Failure|FAILED|\[golden' "$OUT/gpu-tests.log" | cut -c1-400 | head -n 120
  fi
  [ -f "$OUT/gpu-latest.jsonl" ] && { echo "==== bench"; cut -c1-600 "$OUT/gpu-latest.jsonl"; }
  [ -f "$OUT/break-all-reduce.log" ] && { echo "==== break"; grep -E 'tests passed|\(Failed\)|must|guard' "$OUT/break-all-reduce.log"; }
}
exit $failed
