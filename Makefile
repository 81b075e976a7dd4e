# coli: top-level build.
#   make                 libraries, tools, tests (CUDA if nvcc is found)
#   make test            build and run the GoogleTest suites
#   make asan            the suite and the tools with ASan+UBSan, CPU-only, in build-asan/
#   make tsan            the same with TSan, in build-tsan/
#   make check           test + asan + a bounded fuzz run (the README's test command, CI)
#   make run             build and run coli-run on the embedded tiny model
#   make CUDA=0|1|auto   force CUDA off / on, or detect nvcc (default)
#   make CXXFLAGS=-O1    CXXFLAGS / NVCCFLAGS / LDFLAGS set optimisation, debug and
#                        extra flags only; the language level, include paths and
#                        dependency files are always added (COLI_CXXFLAGS)
#   make install PREFIX=/usr/local
# Objects and binaries go to $(BUILD) (default build/).

BUILD   ?= build
PREFIX  ?= /usr/local
CXX     ?= g++
CUDA    ?= auto
CUDA_HOME ?= /usr/local/cuda
NVCC    ?= $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
# sm_90a machine code for Hopper, plus PTX that older GPUs JIT-compile.
CUDA_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_75,code=compute_75

ifeq ($(CUDA),auto)
  CUDA_ON := $(if $(NVCC),1,0)
else
  CUDA_ON := $(CUDA)
endif
ifeq ($(CUDA_ON),1)
  ifeq ($(NVCC),)
    $(error CUDA=1 but no nvcc found; set NVCC or CUDA_HOME)
  endif
endif

# Include paths enforce the layering: libcore sees only itself, each backend
# sees libcore and itself (never the other backend), the tools and tests see
# everything. Pattern-specific values below narrow INCLUDES per library.
INCLUDES  := -Ilibcore -Ilibcpu -Ilibcuda/include -Itools
WARN      := -Wall -Wextra -Wshadow -Wno-unused-parameter
# The user's flags (optimisation, debug, extra warnings) ...
CXXFLAGS  ?= -O2 -g
NVCCFLAGS ?= -O2
# ... and the build's own, always applied: a command-line CXXFLAGS cannot drop
# them. SANITIZE is set by `make asan` / `make tsan` (compile and link).
COLI_CXXFLAGS  = -std=c++20 $(WARN) $(INCLUDES) $(DEFS) $(SANITIZE) -MMD -MP -pthread
COLI_NVCCFLAGS = -std=c++20 $(CUDA_ARCH) $(INCLUDES) $(DEFS) -MMD -MP -Xcompiler -Wall
COLI_LDFLAGS   = $(SANITIZE) -pthread
# Static Boost and CUDA runtime: the binaries run on machines without them.
LDLIBS    := -Wl,-Bstatic -lboost_program_options -lpcre2-8 -lutf8proc -lxxhash -Wl,-Bdynamic -ldl -lrt
ifeq ($(CUDA_ON),1)
  LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart_static
endif

CORE_SRC := $(shell find libcore -name '*.cpp' | sort)
CPU_SRC  := $(shell find libcpu -name '*.cpp' | sort)
ifeq ($(CUDA_ON),1)
  CUDA_SRC := $(shell find libcuda -name '*.cu' | sort)
else
  CUDA_SRC := libcuda/cuda_stub.cpp
endif
TEST_SRC := $(shell find tests tools/common -name '*.cpp' -not -path 'tests/fuzz/*' -not -path 'tests/bench/*' | sort)
BENCH_SRC := $(wildcard tests/bench/*.cpp)
BENCH_BIN := $(BUILD)/bin/coli-microbench
FUZZ_SRC := $(wildcard tests/fuzz/*.cpp)
FUZZ_CXX ?= clang++
FUZZ_SECONDS ?= 20
TOOLS    := $(notdir $(wildcard tools/coli-*))

obj = $(patsubst %,$(BUILD)/obj/%.o,$(1))
CORE_LIB := $(BUILD)/lib/libcolicore.a
CPU_LIB  := $(BUILD)/lib/libcolicpu.a
CUDA_LIB := $(BUILD)/lib/libcolicuda.a
LIBS     := $(CPU_LIB) $(CUDA_LIB) $(CORE_LIB)
BINS     := $(addprefix $(BUILD)/bin/,$(TOOLS))
TEST_BIN := $(BUILD)/bin/coli-tests

.PHONY: all libs tools tests test asan tsan check bench fuzz fuzz-run run install clean
all: tools tests
libs: $(LIBS)
tools: $(BINS)
tests: $(TEST_BIN)

# The commit goes into one object, rebuilt every time.
BUILD_COMMIT := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
$(BUILD)/obj/libcore/util/build_info.cpp.o: DEFS := -DCOLI_BUILD_COMMIT='"$(BUILD_COMMIT)"'
$(BUILD)/obj/libcore/util/build_info.cpp.o: FORCE
.PHONY: FORCE
FORCE:

# Each library's objects get only the include paths it may use: a backend
# header included from libcore, or one backend's from the other, fails to
# compile. Within libcuda each folder sees the ones below it and itself:
#   include/ the public API (plain C++; all the tools and tests see)
#   common/  checks, launches, device arrays     kernels/ device code + launchers
#   device/  probes, registration, twins, copies tier/    the expert tier
#   backend/ the forward pass over all of them
# so a kernel cannot include the tier, nor the tier the backend.
CUDA_INC_BASE := -Ilibcore -Ilibcuda/include -Ilibcuda/common
$(BUILD)/obj/libcore/%: INCLUDES := -Ilibcore
$(BUILD)/obj/libcpu/%:  INCLUDES := -Ilibcore -Ilibcpu
$(BUILD)/obj/libcuda/cuda_stub.cpp.o: INCLUDES := -Ilibcore -Ilibcuda/include
$(BUILD)/obj/libcuda/kernels/%: INCLUDES := $(CUDA_INC_BASE) -Ilibcuda/kernels
$(BUILD)/obj/libcuda/device/%:  INCLUDES := $(CUDA_INC_BASE) -Ilibcuda/device
$(BUILD)/obj/libcuda/tier/%:    INCLUDES := $(CUDA_INC_BASE) -Ilibcuda/kernels -Ilibcuda/device -Ilibcuda/tier
$(BUILD)/obj/libcuda/backend/%: INCLUDES := $(CUDA_INC_BASE) -Ilibcuda/kernels -Ilibcuda/device -Ilibcuda/tier -Ilibcuda/backend

$(BUILD)/obj/%.cpp.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(COLI_CXXFLAGS) $(CXXFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(COLI_NVCCFLAGS) $(NVCCFLAGS) -c $< -o $@

$(CORE_LIB): $(call obj,$(CORE_SRC))
$(CPU_LIB): $(call obj,$(CPU_SRC))
$(CUDA_LIB): $(call obj,$(CUDA_SRC)) $(BUILD)/cuda-$(CUDA_ON).stamp
$(LIBS):
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $(filter %.o,$^)

# Switching CUDA on/off must rebuild libcuda.
$(BUILD)/cuda-$(CUDA_ON).stamp:
	@mkdir -p $(BUILD) && rm -f $(BUILD)/cuda-*.stamp && touch $@

# One link rule per tool folder: tools/coli-x/*.cpp -> $(BUILD)/bin/coli-x,
# with the options layer every tool shares (tools/common/*.cpp).
define TOOL_RULE
$(BUILD)/bin/$(1): $(call obj,$(wildcard tools/$(1)/*.cpp) $(wildcard tools/common/*.cpp)) $(LIBS)
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(COLI_LDFLAGS) $$(CXXFLAGS) $$(LDFLAGS) -o $$@ $$(filter %.o,$$^) $$(LIBS) $$(LDLIBS)
endef
$(foreach t,$(TOOLS),$(eval $(call TOOL_RULE,$(t))))

$(TEST_BIN): $(call obj,$(TEST_SRC)) $(LIBS)
	@mkdir -p $(dir $@)
	$(CXX) $(COLI_LDFLAGS) $(CXXFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIBS) -Wl,-Bstatic -lgtest -Wl,-Bdynamic $(LDLIBS)

test: $(TEST_BIN) $(BINS)
	$(SAN_ENV) COLI_BIN_DIR=$(BUILD)/bin $(TEST_BIN)

# Google Benchmark microbenchmarks (kernels, tokenizer); drivers in scripts/.
bench: $(BENCH_BIN)
$(BENCH_BIN): $(call obj,$(BENCH_SRC)) $(LIBS)
	@mkdir -p $(dir $@)
	$(CXX) $(COLI_LDFLAGS) $(CXXFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIBS) -lbenchmark $(LDLIBS)

# The suite and the tools, CPU-only, under the sanitizers: each in its own
# build folder, tests run against the tools built the same way. UBSan's
# float checks are not in -fsanitize=undefined; every report is fatal.
SAN_CXXFLAGS ?= -O1 -g
ASAN_FLAGS := -fsanitize=address,undefined,float-cast-overflow,float-divide-by-zero -fno-sanitize-recover=all -fno-omit-frame-pointer
TSAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer
# Reports carry stacks; the tools the tests run inherit the settings.
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
TSAN_ENV := TSAN_OPTIONS=second_deadlock_stack=1
asan:
	+$(MAKE) BUILD=$(BUILD)-asan CUDA=0 CXXFLAGS="$(SAN_CXXFLAGS)" SANITIZE="$(ASAN_FLAGS)" SAN_ENV="$(ASAN_ENV)" test
tsan:
	+$(MAKE) BUILD=$(BUILD)-tsan CUDA=0 CXXFLAGS="$(SAN_CXXFLAGS)" SANITIZE="$(TSAN_FLAGS)" SAN_ENV="$(TSAN_ENV)" test

# The README's test command: unit and fixture tests, the same under ASan+UBSan,
# then a bounded fuzz run.
check: test asan fuzz-run

# libFuzzer targets over the parsers of untrusted files (clang required).
# libcore is compiled once with the sanitizers, then linked into each target.
FUZZ_BINS  := $(patsubst tests/fuzz/%.cpp,$(BUILD)/fuzz/%,$(FUZZ_SRC))
FUZZ_CORE  := $(filter-out libcore/engine/% libcore/serve/http_server.cpp libcore/serve/engine_generator.cpp,$(CORE_SRC))
FUZZ_LIBS  := -Wl,-Bstatic -lpcre2-8 -lutf8proc -lxxhash -Wl,-Bdynamic
FUZZ_FLAGS := -std=c++20 -O1 -g -fno-sanitize-recover=all -Ilibcore -MMD -MP
FUZZ_LIB   := $(BUILD)/fuzz/libcolicore-fuzz.a
fuzz: $(FUZZ_BINS)
# Keep the fuzz targets' own objects (make would delete them as intermediates).
.SECONDARY: $(patsubst tests/fuzz/%.cpp,$(BUILD)/fuzzobj/tests/fuzz/%.cpp.o,$(FUZZ_SRC))
$(BUILD)/fuzzobj/%.cpp.o: %.cpp
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@
$(FUZZ_LIB): $(patsubst %,$(BUILD)/fuzzobj/%.o,$(FUZZ_CORE))
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/fuzz/%: $(BUILD)/fuzzobj/tests/fuzz/%.cpp.o $(FUZZ_LIB)
	$(FUZZ_CXX) -fsanitize=fuzzer,address,undefined -o $@ $< $(FUZZ_LIB) $(FUZZ_LIBS)
fuzz-run: $(FUZZ_BINS)
	@for f in $(FUZZ_BINS); do n=$$(basename $$f); c=tests/fuzz/corpus/$${n#fuzz_}; \
	  mkdir -p $(BUILD)/fuzz/work-$$n; \
	  echo "fuzz: $$n for $(FUZZ_SECONDS) s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 $(BUILD)/fuzz/work-$$n $$c >$(BUILD)/fuzz/$$n.log 2>&1; \
	  rc=$$?; tail -n 1 $(BUILD)/fuzz/$$n.log; [ $$rc -eq 0 ] || { tail -n 40 $(BUILD)/fuzz/$$n.log; exit 1; }; \
	done

run: $(BUILD)/bin/coli-run
	$(BUILD)/bin/coli-run --model tests/data/tiny-qwen35moe-text --prompt-ids 1,2,3,4,5 -n 16 --temp 0

install: tools
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5
	install -m 755 $(BINS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(wildcard man/*.1) $(DESTDIR)$(PREFIX)/share/man/man1/
	$(if $(wildcard man/*.5),install -m 644 $(wildcard man/*.5) $(DESTDIR)$(PREFIX)/share/man/man5/)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj $(BUILD)/fuzzobj -name '*.d' 2>/dev/null)
