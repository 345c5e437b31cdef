# llmi — one binary, CPU (OpenMP) backend always, CUDA backend when nvcc is found.
#   make            optimized build -> ./llmi
#   make SAN=1      ASan/UBSan build in build-san/ -> ./llmi-san
#   make CUDA=0     skip CUDA even when nvcc exists (CUDA=1: fail when nvcc is missing)
#   make test       build both, run the whole suite (tests/run.sh)
#   make fuzz       libFuzzer targets (clang, ASan+UBSan) in build-fuzz/ (docs/RELIABILITY.md)
#   make emu        the CUDA backend on the CPU emulator (tests/cuda-emu/, ASan+UBSan) in build-emu/
CC      ?= gcc
SAN     ?= 0
NVCC    ?= $(shell command -v nvcc 2>/dev/null)
CUDA    ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH ?= native

PKGS    := libpcre2-8 libutf8proc libcjson libzstd libxxhash
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -lpcre2-8 -lutf8proc -lcjson -lzstd -lxxhash)

WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
CFLAGS  := -std=c11 -D_GNU_SOURCE $(WARN) -fopenmp -MMD -MP -Isrc -Ikernels $(PKG_CFLAGS)
LDLIBS  := $(PKG_LIBS) -fopenmp -lm -lpthread

ifeq ($(SAN),1)
  BUILD   := build-san
  BIN     := llmi-san
  CFLAGS  += -O1 -g -march=native -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
  LDLIBS  += -fsanitize=address,undefined
  CUDA    := 0
else
  # CPU-only and CUDA objects differ (-DLLMI_CUDA): keep them apart so switching
  # CUDA=0/1 never links a stale mix.
  BUILD   := $(if $(filter 1,$(CUDA)),build,build-cpu)
  BIN     := llmi
  CFLAGS  += -O3 -march=native -g
endif

GIT_COMMIT := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)

# Every .c under src/ is part of llmi: no file list to keep in sync.
SRCS    := $(shell find src -name '*.c' | sort)
OBJS    := $(SRCS:%.c=$(BUILD)/%.o)
CU_SRCS := $(wildcard kernels/*.cu)
CU_OBJS :=
ifeq ($(CUDA),1)
  ifeq ($(NVCC),)
    $(error CUDA=1 but nvcc is not on PATH (add /usr/local/cuda/bin, or set NVCC=/path/to/nvcc))
  endif
  CFLAGS  += -DLLMI_CUDA -I$(CUDA_HOME)/include
  CU_OBJS := $(CU_SRCS:%.cu=$(BUILD)/%.o)
  # cudart linked statically: a GPU machine then needs only the driver, cuBLASLt (the
  # forward's GEMMs), cuBLAS and cuSOLVER (the quantizer's Gram matrices and Cholesky).
  # -lineinfo lets compute-sanitizer name source lines.
  LDLIBS  += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcusolver -lcudart_static -ldl -lrt -lstdc++
  NVFLAGS := -O3 -std=c++17 -lineinfo -Isrc -Ikernels -Xcompiler -Wall,-Wextra,-Werror,-fPIC -Werror all-warnings --expt-relaxed-constexpr
  ifeq ($(CUDA_ARCH),native)
    NV_ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
    NV_ARCH := $(if $(NV_ARCH),$(NV_ARCH),90)
  else
    NV_ARCH := $(CUDA_ARCH)
  endif
  NVFLAGS += -gencode arch=compute_$(NV_ARCH),code=sm_$(NV_ARCH)$(if $(filter 90,$(NV_ARCH)),a)
endif

TEST_SRCS := $(wildcard tests/*.c)
TEST_OBJS := $(TEST_SRCS:%.c=$(BUILD)/%.o)

# Fuzz targets (tests/fuzz/fuzz_*.c): each links LLVMFuzzerTestOneInput with llmi's objects.
# Built twice: by `make fuzz` with clang's libFuzzer, and by `make SAN=1 tools` as
# replayers (tests/fuzz/replay_main.c feeds each corpus file once) that the suite runs,
# so CI replays the corpora under ASan/UBSan without clang.
FUZZ_NAMES  := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_REPLAY := $(FUZZ_NAMES:%=$(BUILD)/fuzz/%)

.PHONY: all test clean san tools fuzz kernel-bench emu FORCE
all: $(BIN)

$(BIN): $(BUILD)/main.o $(OBJS) $(BUILD)/version.o $(CU_OBJS)
	$(CC) -o $@ $^ $(LDLIBS)

$(BUILD)/llmi_tests: $(TEST_OBJS) $(OBJS) $(BUILD)/version.o $(CU_OBJS)
	$(CC) -o $@ $^ $(LDLIBS)

# The commit stamp: version.c is rewritten only when the commit changes, so only
# version.o is rebuilt then, and never left stale.
$(BUILD)/version.c: FORCE
	@mkdir -p $(dir $@)
	@printf '#include "core/version.h"\nconst char *llmi_commit(void) { return "%s"; }\n' "$(GIT_COMMIT)" >$@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@

$(BUILD)/version.o: $(BUILD)/version.c
	$(CC) $(CFLAGS) -c $< -o $@

FORCE:

tools: $(BUILD)/llmi_tests $(if $(filter 1,$(SAN)),$(FUZZ_REPLAY),$(BUILD)/kernel_bench)

# Single-thread microbenchmarks of the CPU kernels (tests/bench/kernel_bench.c, docs/PERF.md):
# thread CPU time, for comparing two builds side by side on a busy machine. Built by
# `make tools` (so by `make test` and CI) so that it cannot rot unbuilt.
kernel-bench: $(BUILD)/kernel_bench
$(BUILD)/kernel_bench: $(BUILD)/tests/bench/kernel_bench.o $(OBJS) $(BUILD)/version.o $(CU_OBJS)
	$(CC) -o $@ $^ $(LDLIBS)

$(BUILD)/fuzz/%: $(BUILD)/tests/fuzz/%.o $(BUILD)/tests/fuzz/common.o $(BUILD)/tests/fuzz/replay_main.o $(OBJS) $(BUILD)/version.o $(CU_OBJS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDLIBS)

FUZZ_CC     ?= clang
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) -fopenmp -MMD -MP -Isrc -Ikernels $(PKG_CFLAGS) -g -O1 \
               -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
               -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION -Wno-string-concatenation
FUZZ_OBJS   := $(SRCS:%.c=build-fuzz/%.o) build-fuzz/version.o build-fuzz/tests/fuzz/common.o
# Objects reached only through pattern rules are intermediate to make: keep them.
.SECONDARY: $(FUZZ_OBJS) $(FUZZ_NAMES:%=build-fuzz/tests/fuzz/%.o) $(FUZZ_NAMES:%=$(BUILD)/tests/fuzz/%.o) \
            $(BUILD)/tests/fuzz/common.o $(BUILD)/tests/fuzz/replay_main.o

fuzz: $(FUZZ_NAMES:%=build-fuzz/%)

build-fuzz/fuzz_%: build-fuzz/tests/fuzz/fuzz_%.o $(FUZZ_OBJS)
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $@ $^ $(PKG_LIBS) -fopenmp -lm -lpthread

build-fuzz/version.o: $(BUILD)/version.c
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

build-fuzz/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@


# The CUDA backend's host code and kernels built against tests/cuda-emu's emulated runtime
# (no nvcc, no GPU), under ASan/UBSan: the suite runs the CUDA unit tests and a greedy
# comparison through it where no GPU is visible (docs/TESTING.md says what it cannot show).
EMU_DIR      := tests/cuda-emu
EMU_SAN      := -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
EMU_CFLAGS   := -std=c11 -D_GNU_SOURCE $(WARN) -fopenmp -MMD -MP -DLLMI_CUDA -I$(EMU_DIR)/include -Isrc -Ikernels \
                $(PKG_CFLAGS) -O1 -g -march=native $(EMU_SAN)
EMU_CXXFLAGS := -std=c++20 -O1 -g -march=native $(EMU_SAN) -MMD -MP -I$(EMU_DIR)/include -Isrc -Ikernels \
                -Wall -Wno-unused-parameter -Wno-unused-variable -Wno-unused-function -Wno-unknown-pragmas
EMU_OBJS     := $(SRCS:%.c=build-emu/%.o) build-emu/version.o $(CU_SRCS:kernels/%.cu=build-emu/kernels/%.o) \
                build-emu/cuda-emu/runtime.o build-emu/cuda-emu/blas.o
EMU_LIBS     := $(EMU_SAN) $(PKG_LIBS) -fopenmp -lm -lpthread

emu: build-emu/llmi_tests build-emu/llmi
build-emu/llmi_tests: $(TEST_SRCS:%.c=build-emu/%.o) $(EMU_OBJS)
	$(CXX) -o $@ $^ $(EMU_LIBS)
build-emu/llmi: build-emu/main.o $(EMU_OBJS)
	$(CXX) -o $@ $^ $(EMU_LIBS)
build-emu/version.o: $(BUILD)/version.c
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) -c $< -o $@
build-emu/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) -c $< -o $@
# the kernels as C++: launches, shared memory and inline PTX rewritten for the emulator
build-emu/kernels/%.cpp: kernels/%.cu $(EMU_DIR)/transform.py
	@mkdir -p $(dir $@)
	python3 $(EMU_DIR)/transform.py $< $@
build-emu/kernels/%.o: build-emu/kernels/%.cpp
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
build-emu/cuda-emu/runtime.o: $(EMU_DIR)/runtime.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
# the emulated cuBLAS/cuSOLVER loops checked their operands already: optimized, no sanitizer
build-emu/cuda-emu/blas.o: $(EMU_DIR)/blas.cpp
	@mkdir -p $(dir $@)
	$(CXX) -std=c++20 -O3 -g -march=native -fopenmp -MMD -MP -I$(EMU_DIR)/include -Wall -Wno-unused-parameter -c $< -o $@
.SECONDARY: $(CU_SRCS:kernels/%.cu=build-emu/kernels/%.cpp)

test:
	$(MAKE) all tools
	$(MAKE) SAN=1 all tools
	$(MAKE) emu
	bash tests/run.sh

clean:
	rm -rf build build-cpu build-san build-fuzz build-emu llmi llmi-san

-include $(OBJS:.o=.d) $(TEST_OBJS:.o=.d) $(BUILD)/main.d $(CU_OBJS:.o=.d) $(wildcard $(BUILD)/tests/fuzz/*.d)
-include $(wildcard $(FUZZ_OBJS:.o=.d) build-fuzz/tests/fuzz/*.d)
-include $(wildcard $(EMU_OBJS:.o=.d) build-emu/tests/*.d build-emu/main.d)
