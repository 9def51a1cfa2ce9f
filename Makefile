# Two commands on a fresh Debian machine: `make demo` and `make test`.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps build demo test bench clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	$(BUILD)/qkv explain
	$(BUILD)/qkv explain --html $(BUILD)/explain.html && echo "seed 003's example as a page: $(BUILD)/explain.html"

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

clean:
	rm -rf $(BUILD)

# Builds Release and prints the comparison table (qkv vs the FMA peak and PyTorch); see BENCHMARKS.md.
bench: build
	bench/run.sh $(BUILD)
