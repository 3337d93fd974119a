# m3kit: one non-recursive Makefile, out-of-tree build into build/.
#   make            reference library, build/m3, CPU tests
#   make test       what CI runs (all ref_* and cmp_* cmocka binaries, summary line last)
#   make demo       the bundled tiny model through the reference, agreement table
#   make bench      CPU benchmarks (figures against ceilings measured in the same run)
#   make gpu        build/m3 with the GPU backend (nvcc -x cu, sm_90a) + gpu_* tests
#   make test-gpu   run gpu_* tests (on the GPU machine)      make bench-gpu
#   make gpu-amd-check  compile gpu/*.hip for gfx90a with Debian's hipcc
#   make test SANITIZE=1  ASan+UBSan build under build/san
#   make lint       dependency fences        make format   clang-format
#   make fuzz       libFuzzer targets, bounded time
# Add a source file and it is picked up: ref/*.c, compare/*.c, gpu/*.hip, tests/<area>.c.

SHELL := /bin/bash
.DEFAULT_GOAL := all
V ?= 0
Q := $(if $(filter 1,$(V)),,@)

# ---- dependencies: install them on a fresh Debian machine before anything else --------
PKGS := openblas hdf5 cmocka libcjson libpcre2-8
ifeq ($(filter clean format lint,$(MAKECMDGOALS)),)
ifneq ($(shell pkg-config --exists $(PKGS) 2>/dev/null && echo ok),ok)
$(info m3kit: build dependencies missing; running scripts/install-deps.sh)
DEPS_RC := $(shell bash scripts/install-deps.sh 1>&2; echo $$?)
ifneq ($(DEPS_RC),0)
$(error scripts/install-deps.sh failed (exit $(DEPS_RC)))
endif
endif
endif

BUILD ?= build
SANITIZE ?= 0
ifeq ($(SANITIZE),1)
B := $(BUILD)/san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else
B := $(BUILD)
SANFLAGS :=
endif

CC ?= gcc
WERROR := $(if $(CI),-Werror,)
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CFLAGS_BASE := -std=c11 -O2 -g -Wall -Wextra -Wshadow -Wdouble-promotion -Wstrict-prototypes \
               -Wmissing-prototypes -Wno-unused-parameter -D_GNU_SOURCE -I. $(PKG_CFLAGS) \
               -MMD -MP $(WERROR) $(SANFLAGS)
# ref/, compare/, tests/: no FMA contraction, never fast-math (determinism first)
CFLAGS := $(CFLAGS_BASE) -ffp-contract=off -fno-fast-math
LDLIBS := $(PKG_LIBS) -lpthread -lm
LDFLAGS := $(SANFLAGS)

GIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)

REF_SRC := $(wildcard ref/*.c)
CMP_SRC := $(filter-out compare/main.c,$(wildcard compare/*.c))
LIB_OBJ := $(patsubst %.c,$(B)/obj/%.o,$(REF_SRC) $(CMP_SRC))
TEST_UTIL := $(B)/obj/tests/util.o
CPU_TESTS := $(patsubst tests/%.c,$(B)/tests/%,$(wildcard tests/ref_*.c tests/cmp_*.c))
GPU_TESTS_SRC := $(wildcard tests/gpu_*.c)

# ---- GPU backend -----------------------------------------------------------------------
GPU ?= 0
CUDA_HOME ?= /usr/local/cuda
HIPCC ?= $(if $(wildcard $(CUDA_HOME)/bin/nvcc),$(CUDA_HOME)/bin/nvcc,nvcc)
# sm_90a: the arch-specific Hopper target, needed by wgmma (gpu/moe.hip wg_k); its machine
# code runs on compute capability 9.0 only
GPU_ARCH ?= sm_90a
HIP_SRC := $(wildcard gpu/*.hip)
GPU_OBJ := $(patsubst %.hip,$(B)/obj/%.o,$(HIP_SRC))
NVCCFLAGS := -x cu -std=c++17 -O3 -g -lineinfo \
             -gencode arch=compute_$(patsubst sm_%,%,$(GPU_ARCH)),code=$(GPU_ARCH) -I. -Xcompiler -Wall \
             -Xcompiler -fno-fast-math --expt-relaxed-constexpr -MMD -MP
ifeq ($(GPU),1)
BACKEND_OBJ := $(GPU_OBJ)
BACKEND_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++ -ldl -lrt
else
BACKEND_OBJ := $(B)/obj/gpu/nogpu.o
BACKEND_LIBS :=
endif
# build/m3 must be relinked when the backend changes
BACKEND_STAMP := $(B)/.backend
$(shell mkdir -p $(B); [ "$$(cat $(BACKEND_STAMP) 2>/dev/null)" = "$(GPU)" ] || echo $(GPU) > $(BACKEND_STAMP))

# ---- rules -----------------------------------------------------------------------------
.SECONDARY:
.DELETE_ON_ERROR:
.PHONY: all test demo bench gpu test-gpu bench-gpu gpu-amd-check lint format clean fuzz install tests

all: $(B)/m3 tests

tests: $(CPU_TESTS)

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

# the version string carries the git commit; only base.o depends on it
$(B)/obj/ref/base.o: ref/base.c $(B)/.git-$(GIT)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -DM3_GIT='"$(GIT)"' -c $< -o $@
$(B)/.git-$(GIT):
	@mkdir -p $(B); rm -f $(B)/.git-*; touch $@

$(B)/obj/%.o: %.hip
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  HIPCC   $<")
	$(Q)$(HIPCC) $(NVCCFLAGS) -c $< -o $@

$(B)/libm3.a: $(LIB_OBJ)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@; ar rcs $@ $^

$(B)/m3: $(B)/obj/compare/main.o $(B)/libm3.a $(BACKEND_OBJ) $(BACKEND_STAMP)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $(B)/obj/compare/main.o $(BACKEND_OBJ) $(B)/libm3.a $(BACKEND_LIBS) $(LDLIBS)

$(B)/tests/%: $(B)/obj/tests/%.o $(TEST_UTIL) $(B)/libm3.a $(BACKEND_OBJ) $(BACKEND_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(TEST_UTIL) $(BACKEND_OBJ) $(B)/libm3.a $(BACKEND_LIBS) $(LDLIBS)

test: $(B)/m3 $(CPU_TESTS)
	$(Q)M3=$(B)/m3 bash scripts/run-tests.sh $(CPU_TESTS)

demo: $(B)/m3
	$(Q)M3=$(B)/m3 bash scripts/demo.sh

bench: $(B)/m3
	$(Q)M3=$(B)/m3 bash scripts/bench.sh

gpu:
	$(Q)$(MAKE) --no-print-directory GPU=1 $(B)/m3 $(patsubst tests/%.c,$(B)/tests/%,$(GPU_TESTS_SRC))

test-gpu: gpu
	$(Q)M3=$(B)/m3 bash scripts/run-tests.sh $(patsubst tests/%.c,$(B)/tests/%,$(GPU_TESTS_SRC))

bench-gpu: gpu
	$(Q)M3=$(B)/m3 bash scripts/bench-gpu.sh

gpu-amd-check:
	$(Q)bash scripts/gpu-amd-check.sh $(HIP_SRC)

fuzz:
	$(Q)bash scripts/fuzz.sh

lint:
	$(Q)bash scripts/lint.sh

format:
	$(Q)clang-format -i $$(git ls-files '*.c' '*.h' '*.hip')

PREFIX ?= /usr/local
install: $(B)/m3
	install -D -m 755 $(B)/m3 $(DESTDIR)$(PREFIX)/bin/m3

clean:
	rm -rf $(BUILD)

-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)
