# Two commands on a fresh Debian machine: `make demo` and `make test`.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps deps-demo deps-package build demo-build demo test test-asan-fuzz test-tsan-arm64 bench clean sanitize sanitize-asan sanitize-tsan \
  fuzz fuzz-smoke arm64 check-long package soak

all: build

# `make demo` installs only what the demo needs (scripts/install-deps.sh demo); `make test`,
# `make build` and the rest install the test set too (README "Two commands": sizes and times).
deps:
	@scripts/install-deps.sh test
deps-demo:
	@scripts/install-deps.sh demo
deps-package:
	@scripts/install-deps.sh package

# With ccache (make deps installs it), the pip tests' own tree build-pip/ (setup.py) gets this
# build's objects instead of compiling the library and module again inside ctest, even with an
# empty cache; CCACHE_BASEDIR makes the two trees' paths hash alike. CCACHE is looked up when a
# recipe runs (=, not :=), after deps has installed it, so a fresh machine's first build uses it.
CCACHE = $(shell command -v ccache)
export CCACHE_BASEDIR := $(CURDIR)

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake -S . -B $(BUILD) -DQKV_BUILD_TESTS=ON -DQKV_BUILD_BENCH=ON -DQKV_PYTHON=ON >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

# The demo's build: the qkv command only. A first configure here turns the tests and benchmarks
# off (GoogleTest and Google Benchmark are not in the demo's set); `make build`/`make test` turn
# them on again in the same tree.
demo-build: deps-demo
	test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release \
	  -DQKV_BUILD_TESTS=OFF -DQKV_BUILD_BENCH=OFF $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS) --target qkv_cli

MONEY = "I went to the bank to deposit money"
RIVER = "we sat by the river bank"

# The tutorial's example, then real words: word vectors trained on GCIDE and a layer trained on its
# sentences (`qkv train --task context`; both cached in $(BUILD)/data, minutes the first time),
# ending with "bank" by the river and "bank" with money, and the sense evaluation that measures
# what the layer learned (it needs the Python module, which the context-layer target builds).
demo: demo-build
	$(BUILD)/qkv explain
	$(BUILD)/qkv explain --html $(BUILD)/explain.html && echo "seed 003's example as a page: $(BUILD)/explain.html"
	cmake --build $(BUILD) --target embeddings context-layer
	$(BUILD)/qkv explain $(RIVER) --html $(BUILD)/river-bank.html && \
	  echo "the trained layer on a real sentence: $(BUILD)/river-bank.html"
	$(BUILD)/qkv compare --word bank $(MONEY) $(RIVER)
	PYTHONPATH=$(BUILD)/python scripts/sense_eval.py $(BUILD)/data/words.txt

# ctest (with a 1,000-case property slice; it builds the word vectors too, as Data.embeddings),
# then sanitizers, a fuzz smoke run and the kernels on ARM64 under qemu (docs/testing.md), as two
# chains at once, each on its own trees: ASan then the fuzzers (the same tree), TSan then arm64.
# One chain's runs that leave a core idle (the qemu run, the ASan tests, fuzz replays, links)
# overlap the other's compiles; -Oline keeps each output line whole.
test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)
	$(MAKE) --no-print-directory -j2 -Oline test-asan-fuzz test-tsan-arm64

# The two chains of `make test`, each in order (-j1).
test-asan-fuzz:
	$(MAKE) --no-print-directory -j1 sanitize-asan fuzz-smoke
test-tsan-arm64:
	$(MAKE) --no-print-directory -j1 sanitize-tsan arm64

FUZZ_SECONDS ?= 600
FUZZ_SMOKE_SECONDS ?= 20
CHECK_LONG_CASES ?= 10000

# ASan+UBSan build of every C++ test (clang, the fuzzers' tree), TSan (clang, libomp + Archer) of the threaded ones.
sanitize: sanitize-asan sanitize-tsan
sanitize-asan sanitize-tsan:
	JOBS=$(JOBS) scripts/sanitize.sh $(@:sanitize-%=%)

# Each libFuzzer target for FUZZ_SECONDS (build-asan, clang-14; the ASan tests' tree); fuzz-smoke: ~20 s each on the committed corpus.
fuzz:
	JOBS=$(JOBS) scripts/fuzz.sh run $(FUZZ_SECONDS)

# JOBS fuzzers at a time: each is single-threaded and runs for a fixed time.
fuzz-smoke:
	JOBS=$(JOBS) FUZZ_PARALLEL=$(JOBS) scripts/fuzz.sh smoke $(FUZZ_SMOKE_SECONDS)

# The kernels cross-built for aarch64 (build-arm64) and checked under qemu-aarch64; correctness
# only. Skips, saying why, without g++-aarch64-linux-gnu or qemu-user.
arm64:
	JOBS=$(JOBS) scripts/arm64.sh

# CHECK_LONG_CASES random problems of the fused forward and backward kernels vs the float64 reference.
check-long: build
	QKV_PROPERTY_CASES=$(CHECK_LONG_CASES) QKV_TEST_DATA=$(CURDIR)/tests/data $(BUILD)/tests/qkv_tests --gtest_filter='Property.*'

# The long soak (docs/soak-and-fuzz.md): decode over paged caches of every dtype, layer training and
# save/load, with resident memory, the free-page count and the results against float64 checked.
SOAK_ARGS ?= --decode-steps 100000 --train-steps 10000 --io-rounds 10000
soak: build
	$(BUILD)/tests/qkv_soak $(SOAK_ARGS)

clean:
	rm -rf $(BUILD) $(PACKAGE_BUILD)

# A .deb of the library, headers, CMake package, pkg-config file, the qkv command and the Python
# module (README, "C++"; docs/cpp.md): apt-get install ./$(BUILD)/qkv_*.deb. cpack first builds all
# of the tree it packs, so the .deb comes from a tree of its own without the tests and benchmarks
# (a developer's $(BUILD) keeps them). It ships the data `make demo` trained into $(BUILD)/data,
# linked anew each time so that a retrained file is the one shipped.
PACKAGE_BUILD ?= $(BUILD)-package
package: deps-package
	test -f $(PACKAGE_BUILD)/CMakeCache.txt || cmake -S . -B $(PACKAGE_BUILD) -DCMAKE_BUILD_TYPE=Release \
	  -DQKV_BUILD_TESTS=OFF -DQKV_BUILD_BENCH=OFF $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache) $(CMAKE_FLAGS)
	mkdir -p $(PACKAGE_BUILD)/data
	for f in words.txt context-layer.safetensors; do rm -f $(PACKAGE_BUILD)/data/$$f; \
	  if [ -f $(BUILD)/data/$$f ]; then ln $(BUILD)/data/$$f $(PACKAGE_BUILD)/data/$$f || cp $(BUILD)/data/$$f $(PACKAGE_BUILD)/data/; fi; done
	cmake --build $(PACKAGE_BUILD) -j$(JOBS)
	cd $(PACKAGE_BUILD) && cpack -G DEB -B $(abspath $(BUILD))

# Builds Release and prints the comparison table (qkv vs the FMA peak and PyTorch); see docs/benchmarks.md.
bench: build
	bench/run.sh $(BUILD)
