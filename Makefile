# exl3 — top-level entry points. `make demo` and `make test` do all set-up on a fresh Debian 12
# machine (root, registries reachable): they install missing build dependencies first.
#
#   make demo           build; synthetic MoE model -> exl3 quantize -> generate (CPU, CUDA) -> eval (KL)
#   make test           build (CUDA too when nvcc exists) and run the whole test suite (ctest)
#   make test-sanitize  the test suite again under AddressSanitizer + UndefinedBehaviorSanitizer
#   make fuzz           build the libFuzzer targets with clang and run each for FUZZ_SECONDS
#   make bench          CPU decode / reference-linear benchmarks
#   make format         clang-format every source file

SHELL := /bin/bash
JOBS ?= $(shell nproc)
BUILD ?= build
BUILD_TYPE ?= Release
FUZZ_SECONDS ?= 30

# Every build is a unity build (CMake batches of 8 sources per translation unit), generated for
# Ninja: the library's JSON-heavy sources share their template instantiations, which cuts a cold
# CI build (Release, sanitizers, fuzz) to about half. For incremental work on a few files,
# `make build UNITY=OFF` recompiles only what changed. The generator is chosen when a build
# folder is first configured (an existing folder keeps its own).
UNITY ?= ON
CMAKE_GEN = $(if $(wildcard $(1)/CMakeCache.txt),,-G Ninja) -DCMAKE_UNITY_BUILD=$(UNITY)

# CUDA is built whenever the toolkit is present (CI compiles the kernels; GPU tests skip without
# a device). Override with `make test CUDA=OFF`.
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(NVCC),)
CUDA ?= OFF
else
CUDA ?= ON
export CUDACXX ?= $(NVCC)
endif

DEBS := cmake make ninja-build g++ pkg-config python3 python3-venv nlohmann-json3-dev libcli11-dev libfmt-dev libtbb-dev \
        libpcre2-dev libutf8proc-dev libssl-dev libcpp-httplib-dev libboost-dev libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev

.PHONY: deps configure build demo test test-sanitize fuzz bench format clean

deps:
	@missing=""; for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "exl3: installing missing Debian packages:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "exl3: run as root, or: sudo apt-get install -y$$missing"; exit 1; fi; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi

configure: deps
	cmake -S . -B $(BUILD) $(call CMAKE_GEN,$(BUILD)) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DEXL3_CUDA=$(CUDA) -DEXL3_WERROR=ON

build: configure
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)/tools/exl3 demo-out

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 600

test-sanitize: deps
	cmake -S . -B $(BUILD)-asan $(call CMAKE_GEN,$(BUILD)-asan) -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1" -DEXL3_CUDA=OFF \
	  -DEXL3_WERROR=ON -DEXL3_SANITIZE=ON -DEXL3_BUILD_BENCH=OFF
	cmake --build $(BUILD)-asan -j$(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j$(JOBS) --timeout 900

fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B $(BUILD)-fuzz $(call CMAKE_GEN,$(BUILD)-fuzz) -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1" -DEXL3_CUDA=OFF \
	  -DEXL3_FUZZ=ON -DEXL3_BUILD_TESTS=OFF -DEXL3_BUILD_BENCH=OFF
	cmake --build $(BUILD)-fuzz -j$(JOBS) --target fuzz_all
	@set -e; for t in $(BUILD)-fuzz/fuzz/fuzz_*; do \
	  [ -x "$$t" ] || continue; name=$$(basename $$t); \
	  mkdir -p $(BUILD)-fuzz/corpus/$$name; \
	  seeds=fuzz/corpus/$$name; [ -d $$seeds ] || seeds=""; \
	  echo "fuzz: $$name for $(FUZZ_SECONDS)s"; \
	  $$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $(BUILD)-fuzz/corpus/$$name $$seeds 2>&1 | tail -n 12; \
	done

bench: build
	$(BUILD)/bench/exl3_bench_cpu --benchmark_counters_tabular=true

format:
	find include src tools tests bench fuzz \( -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) \
	  -print0 | xargs -0 clang-format -i

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz demo-out
