# mmc — top-level entry points. CMake does the building; this file wires the README's
# commands to it. `make run` = the built-in demo, `make test` = every CPU test but the long
# ones, `make test-demos` = those (the full demo, long multi-rank runs: ctest label "demo").
BUILD   ?= build
JOBS    ?= $(shell nproc)
REF_VENV ?= .venv-ref
CMAKE_FLAGS ?=

.PHONY: all deps build run run-omni run-image test test-demos test-asan fuzz bench fixtures clean

all: build

deps:
	@bash scripts/bootstrap.sh

$(BUILD)/CMakeCache.txt:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: deps $(BUILD)/CMakeCache.txt
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory | grep -E 'error|warning|Error' || true
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory >/dev/null

run: build
	@bash scripts/demo.sh $(BUILD)

run-omni: build
	@bash scripts/demo_omni.sh $(BUILD)

run-image: build
	@bash scripts/demo_image.sh $(BUILD)

# ctest's exit status is the target's; after ctest's summary, the skipped tests and why
# (tests/report_skips.sh; ctest itself lists them without the reason).
CTEST = ctest --output-on-failure --test-output-size-passed 65536 -j 2
define run_ctest   # $(call run_ctest,BUILD_DIR,CTEST_ARGS,ENV)
	@rm -f $(1)/Testing/junit.xml; cd $(1) && $(3) $(CTEST) $(2) --output-junit $(abspath $(1))/Testing/junit.xml; rc=$$?; \
	  bash $(CURDIR)/tests/report_skips.sh $(abspath $(1))/Testing/junit.xml; exit $$rc
endef

test: build
	$(call run_ctest,$(BUILD),-LE demo)

test-demos: build
	$(call run_ctest,$(BUILD),-L demo)

test-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMMC_SANITIZE=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build build-asan -j $(JOBS) >/dev/null
	$(call run_ctest,build-asan,-LE demo,ASAN_OPTIONS=detect_leaks=1)

fuzz: deps
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMMC_FUZZ=ON -DMMC_SANITIZE=ON >/dev/null
	@cmake --build build-fuzz -j $(JOBS) >/dev/null
	@bash scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS)

bench: build
	@bash bench/run.sh $(BUILD) $(REF_VENV)

$(REF_VENV)/bin/python:
	python3 -m venv $(REF_VENV)
	$(REF_VENV)/bin/pip install -q -r tools/ref/requirements.txt

fixtures: $(REF_VENV)/bin/python
	@for f in tools/ref/gen_*.py; do echo "fixtures: $$f"; $(REF_VENV)/bin/python $$f || exit 1; done

clean:
	rm -rf $(BUILD) build-asan build-fuzz
