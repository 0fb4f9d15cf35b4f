# Thin wrapper over CMake. `make` builds Release into build/, `make test`
# runs the whole suite through ctest, `make demo` runs the main job.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
CTEST_ARGS ?=
PREFIX     ?= /usr/local

.PHONY: all build deps test demo asan tsan format lint clean install install-torch

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

demo: deps build
	@scripts/demo.sh $(BUILD)

# libdtrain.a and .so, the headers, the dtrain binary, dtrain.pc, the man
# pages and the examples under PREFIX (default /usr/local).
install: build
	cmake --install $(BUILD) --prefix $(PREFIX) --component dtrain

# The PyTorch backend (bindings/torch, built by `make` when PyTorch is
# installed: scripts/install-deps.sh --torch) into the interpreter's site
# directory, so that `import dtrain_torch` works without PYTHONPATH.
install-torch: build
	cmake --install $(BUILD) --component torch

asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	      -DDT_SANITIZE=address,undefined $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    ctest --output-on-failure -j $(JOBS) -LE noasan $(CTEST_ARGS)

tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	      -DDT_SANITIZE=thread $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1 \
	    ctest --output-on-failure -j $(JOBS) -L tsan $(CTEST_ARGS)

SOURCES = $(shell git ls-files '*.c' '*.h' '*.cpp' '*.hpp' 2>/dev/null)

format:
	clang-format -i $(SOURCES)

lint: $(BUILD)/CMakeCache.txt
	clang-format --dry-run --Werror $(SOURCES)
	cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability \
	    --inline-suppr --std=c11 -I include -I src --suppress=missingIncludeSystem \
	    src include

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
