# The two README commands: `make run` (main job) and `make test` (all tests).
# Both install what they need first (Debian packages, via scripts/setup.sh).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup configure build run test test-tsan bench format clean

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

bench: build
	bash bench/run.sh $(BUILD)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.hpp')

clean:
	rm -rf $(BUILD)
