# The two README commands: `make run` (main job) and `make test` (all tests).
# Both install what they need first (Debian packages, via scripts/setup.sh).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup configure build run test test-gpu test-tsan test-asan test-hosts fuzz fresh-check bench bench-gpu format clean

setup:
	@bash scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

run:
	BUILD=$(BUILD) bash scripts/run.sh

test:
	BUILD=$(BUILD) bash scripts/test.sh

# The tests labelled "gpu" (tests/gpu/), for a machine with a GPU: DISTJAX_REQUIRE_GPU=1 turns
# their skip without a GPU into a failure. (On the GPU machine, which has no package registry,
# scripts/gpu-machine.sh builds and runs them instead.)
test-gpu: build
	cd $(BUILD) && DISTJAX_REQUIRE_GPU=1 ctest --output-on-failure -L '^gpu$$'

# The main job across two "hosts" (network namespaces joined by veth pairs, OpenMPI over
# TCP, scripts/hosts.sh), bitwise against the threads run. Needs root.
test-hosts:
	@bash scripts/test_hosts.sh

# ThreadSanitizer run of the comm tests, the data prefetcher's, and the pipeline and
# checkpoint tests (devices as threads: schedules, sends and receives between stages, saves
# and loads on every device) and the ring attention of context parallelism, in its own build
# directory. Those run with one OpenMP thread per device: OpenMP's workers meet in libgomp's
# barriers, which are not instrumented, so TSan would report a kernel's shared arguments as
# races between a device thread and its own workers. Not part of `make test` (a cold
# TSan build of the library takes several minutes on 2 cores).
TSAN_BUILD ?= build-tsan
test-tsan: setup
	@cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDISTJAX_SANITIZE=thread \
	  -DDISTJAX_WITH_MPI=OFF -DDISTJAX_WITH_CUDA=OFF -DDISTJAX_BUILD_EXAMPLES=OFF \
	  -DDISTJAX_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target communicator_test comm_failure_test prefetch_test \
	  pipeline_test checkpoint_test checkpointer_test context_parallel_test
	cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --output-on-failure -L '^comm$$' -j $(JOBS)
	cd $(TSAN_BUILD) && OMP_NUM_THREADS=1 \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --output-on-failure -R '^(Prefetcher|Pipeline|Checkpoint|CheckpointChild|CheckpointReshard|CheckpointResume|Checkpointer|ContextParallelBalance|Meshes/ContextParallel)\.' -j $(JOBS)

# AddressSanitizer and UndefinedBehaviorSanitizer over the whole CPU suite (MPI tests
# included; CUDA, the Python module and the benchmarks off), in its own build directory with
# the Release flags (-O1 sums in other orders than the parity tests' 1e-6 bounds allow; at
# -O3 -march=native they hold but for two cross-mesh loss checks, which take twice the bound
# under ASan: distjax::testing::loss_bound) and line tables. A report fails its test (halt_on_error). LeakSanitizer is
# on, with the leaks of libraries outside DistJax suppressed by name (tests/lsan.supp; the
# processes under mpirun unwind their allocations slowly to get there, tests/CMakeLists.txt).
# The consumer test is left out: a program built without ASan cannot load an ASan library.
# Not in CI (docs/reliability.md says how long it takes on 2 cores).
ASAN_BUILD ?= build-asan
test-asan: setup
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  "-DCMAKE_CXX_FLAGS_RELEASE=-O3 -DNDEBUG -g1" -DDISTJAX_SANITIZE=address,undefined \
	  -DDISTJAX_WITH_CUDA=OFF -DDISTJAX_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && OMP_WAIT_POLICY=passive \
	  ASAN_OPTIONS="detect_leaks=1 halt_on_error=1 detect_stack_use_after_return=0" \
	  LSAN_OPTIONS="suppressions=$(CURDIR)/tests/lsan.supp print_suppressions=0" \
	  UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1" \
	  ctest --output-on-failure -LE '^(gpu|consumer)$$' -j $(JOBS) --timeout 1500

# libFuzzer runs of the readers of untrusted files (fuzz/: the TOML config with --set, the
# safetensors files and the index of checkpoints), clang with ASan and UBSan, in their own
# build directory: each target's regression inputs, then FUZZ_SECONDS of fuzzing on its
# corpus (scripts/fuzz.sh). FUZZ_SECONDS=20 is the short run; FUZZ_RUNS=N runs N
# executions from a fixed seed instead (what CI runs: the same every time).
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_RUNS ?=
FUZZ_TARGETS ?= config safetensors checkpoint_index
fuzz:
	@bash scripts/setup.sh fuzz
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" -DDISTJAX_FUZZ=ON \
	  -DDISTJAX_WITH_MPI=OFF -DDISTJAX_WITH_CUDA=OFF -DDISTJAX_BUILD_TESTS=OFF \
	  -DDISTJAX_BUILD_EXAMPLES=OFF -DDISTJAX_BUILD_BENCH=OFF -DDISTJAX_BUILD_TOOLS=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(FUZZ_TARGETS:%=%_fuzzer)
	@FUZZ_RUNS=$(FUZZ_RUNS) bash scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The README's two commands on a clean Debian root (debootstrap, chroot): see
# scripts/fresh-check.sh. SUITE=bookworm (Debian 12, the default) or SUITE=trixie (Debian 13).
# Run it on both after any change to dependencies, scripts/, CMake or .ci/.
SUITE ?= bookworm
fresh-check:
	SUITE=$(SUITE) bash scripts/fresh-check.sh

bench: build
	bash bench/run.sh $(BUILD)

# On a GPU machine: GPT-2 124M on the GPU against PyTorch and JAX there, into
# bench/results/gpu-latest.jsonl (scripts/gpu-machine.sh with BENCH=1 builds and runs it).
bench-gpu: build
	bash bench/gpu.sh $(BUILD)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.hpp' '*.cu')

clean:
	rm -rf $(BUILD)
