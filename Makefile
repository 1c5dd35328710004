# The course's build. `make chapter-N`, `make all`, `make test`, `make demo`,
# `make bench`, `make setup`, `make clean`.
#   BACKEND=cpu   C + OpenMP + OpenBLAS, collectives over MPI (the default)

BACKEND ?= cpu
CC      := mpicc
ARCH    ?= -march=native
CFLAGS  ?= -O3 $(ARCH)
CFLAGS  += -std=c11 -D_GNU_SOURCE -fopenmp -Wall -Wextra -Werror -Icommon -MMD -MP
LDLIBS  := -lm

# OpenBLAS, the OpenMP build: one thread pool shared with our OpenMP loops, and
# single-threaded when called inside a parallel region (attention heads).
MULTIARCH := $(shell gcc -print-multiarch 2>/dev/null)
BLAS_DIR  ?= /usr/lib/$(MULTIARCH)/openblas-openmp
BLAS_INC  ?= /usr/include/$(MULTIARCH)/openblas-openmp
ifneq ($(wildcard $(BLAS_DIR)/libopenblas.so),)
  CFLAGS += -I$(BLAS_INC)
  LDLIBS += -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas
else
  LDLIBS += -lopenblas
endif

BUILD := build
COMMON_SRC := common/common.c common/memory.c common/model.c common/init.c \
              common/checkpoint.c common/data.c common/mesh.c common/runtime.c \
              common/args.c common/report.c common/train.c
ifeq ($(BACKEND),cpu)
  BACKEND_SRC := common/cpu/ops.c common/cpu/device.c common/cpu/comm.c
else
  $(error BACKEND=$(BACKEND) is not available yet: use BACKEND=cpu)
endif
COMMON_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(COMMON_SRC) $(BACKEND_SRC))

CHAPTERS := 0 1

.PHONY: all test demo bench setup clean $(addprefix chapter-,$(CHAPTERS)) tools tests
all: $(addprefix chapter-,$(CHAPTERS)) tools

chapter-0: $(BUILD)/chapter-0
$(BUILD)/chapter-0: $(BUILD)/obj/00_mesh/main.o $(COMMON_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

chapter-1: $(BUILD)/chapter-1
$(BUILD)/chapter-1: $(BUILD)/obj/01_collectives/main.o $(COMMON_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

tools: $(BUILD)/tokenize
$(BUILD)/tokenize: $(BUILD)/obj/common/tools/tokenize.o $(COMMON_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

# ---------------------------------------------------------------- tests
TESTS := test_ops test_model test_data
tests: $(addprefix $(BUILD)/tests/,$(TESTS))
$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/obj/tests/%.o: CFLAGS += -Itests

test: all tests
	@bash tests/run.sh

# ---------------------------------------------------------------- running
# The set-up: Debian packages (installed when root, else the apt-get line).
setup:
	@bash .ci/install-deps.sh

# Trains the small model on the default corpus and prints what it writes.
DEMO_STEPS ?= 300
demo: setup
	@$(MAKE) --no-print-directory all
	bash tests/mpirun.sh -np 1 $(BUILD)/chapter-0 --model small --steps $(DEMO_STEPS) \
	    --val-every 100 --sample 400 --log $(BUILD)/demo.jsonl

# The reference's speed on the small preset, one rank.
bench: all
	bash tests/mpirun.sh -np 1 $(BUILD)/chapter-0 --model small --steps 12 --log $(BUILD)/bench-ref.jsonl

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
