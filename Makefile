# The two commands of the README, and the sanitizer pass CI adds:
#   make demo      install dependencies, build, run the main job (ddptrain, 2 processes)
#   make demo-gpt  the language-model job: a byte-level GPT on Debian's fortunes, then a sample
#   make test      install dependencies, build, run every test under CTest
#   make sanitize  the test suite again under ASan+UBSan and under TSan
#   make fuzz      libFuzzer on every input format, 60 s each (scripts/fuzz.sh; docs/fuzzing.md)
# Everything else is CMake: `cmake -S . -B build && cmake --build build`.

BUILD    ?= build
JOBS     ?= $(shell nproc)
WERROR   ?= ON
CTEST    := ctest --output-on-failure --no-tests=error
# Two tests on the cores at once, and beside them up to two that mostly wait (tests/CMakeLists.txt)
CTEST_J  := -j 4 --resource-spec-file $(CURDIR)/tests/ctest-resources.json

.PHONY: all deps build demo demo-gpt test sanitize asan tsan fuzz bench clean

all: build

deps:
	@scripts/install-deps.sh

# Configure once; later runs only rebuild what changed.
$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DDDP_WERROR=$(WERROR)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The main job: the default model on Fashion-MNIST with 2 processes; ends with the test accuracy.
demo: build
	$(BUILD)/bin/ddprun --standalone --nproc_per_node=2 $(BUILD)/bin/ddptrain --overwrite true

# The language-model job: a small GPT on the fortunes text, validation loss falling, a sample.
demo-gpt: build
	$(BUILD)/bin/ddprun --standalone --nproc_per_node=2 $(BUILD)/bin/ddptrain \
	    --config configs/gpt-fortunes.yaml --overwrite true

test: build
	cd $(BUILD) && $(CTEST) $(CTEST_J)

# The sanitizer builds use the plain build's venv for python.tensorboard (made once), and line
# tables for debug information (-g1: file:line and inlined frames in every report, no variables):
# an eighth less compiling than -g (CPU: ASan build 375 → 326 s, TSan 77 → 67 s), on every CI run.
SAN_DEBUG := -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
             -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
build-asan/CMakeCache.txt:
	cmake -S . -B build-asan -DDDP_SANITIZE=address -DDDP_WERROR=$(WERROR) \
	    -DDDP_TB_VENV=$(abspath $(BUILD))/tb-venv $(SAN_DEBUG)
build-tsan/CMakeCache.txt:
	cmake -S . -B build-tsan -DDDP_SANITIZE=thread -DDDP_WERROR=$(WERROR) \
	    -DDDP_TB_VENV=$(abspath $(BUILD))/tb-venv $(SAN_DEBUG)

asan: deps build-asan/CMakeCache.txt
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(CTEST) $(CTEST_J)

tsan: deps build-tsan/CMakeCache.txt
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 $(CTEST) $(CTEST_J)

sanitize: asan tsan

fuzz: deps
	scripts/fuzz.sh

bench: build
	bench/launch.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
