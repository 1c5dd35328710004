# The course's build.
#   make chapter-N     build/chapter-N (N = 0..7, the chapters that exist)
#   make capstone-bin  build/capstone: every axis at once on chapter 7's model (capstone/)
#   make all           every chapter, the capstone and the tools (tokenize, roofline, plan)
#   make test          every test; ends with "N passed, N failed, N skipped"
#   make docs-check    the docs' code references, links and quoted figures (docs/TEMPLATE.md)
#   make site          the course as a website, build/site/index.html (tools/site/, offline)
#   make site-check    every page of it in headless Chromium: loads, links, anchors, images,
#                      no JavaScript error, each `path:N` link at what its lesson names
#   make test CHAPTER=N   only chapter N's tests (tests/chapter_N.sh: its mesh,
#                      invariant, accounting, error and --help cases);
#                      CHAPTER=capstone, unit, plots or gpu runs that script (tests/run.sh)
#   make demo          set-up, then train the small model and print a sample
#   make bench-ref     the roofline (build/roofline), then the reference's speed on the small model (one rank)
#   make bench-peer    the same model in PyTorch, alternated with chapters 0 and 2
#   make profile       this machine's profile for build/plan --profile (PROFILE=build/profile.txt)
#   make plan-check    the planner's predicted ms/step against runs of the sweep's configurations
#   make bench, plots  the sweep over chapters and its plots in build/plots/ (docs/plots/plots.mk)
#   make bench-ckpt    each checkpoint level and mode, timed (docs/plots/data/ckpt/; make plots draws them)
#   make docs-plots    redraws the docs' figures, docs/plots/*.png, from docs/plots/data/
#   make timeline TRACE=FILE.json   a --trace file as a Gantt chart PNG (docs/tracing.md)
#   make capstone      build/capstone's step: its collectives on a multi-axis mesh, per group, in order (docs/capstone.md)
#   make setup         install the Debian packages (as root) or print the line
#   make fuzz          fuzz the file loaders (libFuzzer, FUZZ_SECONDS each)
#   make sweep-layouts the invariant on random capstone layouts (SWEEP_SECONDS, SWEEP_SEED)
#   make sanitize      the tiny tests under ASan and UBSan (build/sanitize/)
#   make portability   the docs and a run per chapter with OpenBLAS's Haswell kernels,
#                      without -march=native (build/portable/), built by clang
#                      (build/clang/) and over TCP, and the bit-for-bit claims at
#                      x86-64-v2, v3 and v4 (tests/portability.sh)
#   make homework CHAPTER=N [DEST=dir]   a student tree: chapter N's exercises cut out
#   make grade CHAPTER=N [EXERCISE=K]    grade them: "grade chapter N: S / T"
#   make grade-class CHAPTER=N SUBMISSIONS=DIR   a class: one line a folder, a CSV
#   make homework-check  the homework tests with every buggy variant (tests/homework.sh)
#   OPT, CFLAGS, CUDA_ARCH: a change rebuilds everything (flags.stamp)
#   make clean
#
#   BACKEND=cpu    C + OpenMP + OpenBLAS, collectives over MPI; binaries in build/
#   BACKEND=cuda   CUDA + cuBLAS, collectives over NCCL; binaries in build/cuda/
#   The default is cuda where nvidia-smi lists a GPU and nvcc exists, else cpu.

# Everything built goes under BUILD (make sanitize builds into its own).
BUILD ?= build

HAVE_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
HAVE_NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(filter-out 0,$(HAVE_GPU)),)
  DEFAULT_BACKEND := cpu
else ifeq ($(HAVE_NVCC),)
  DEFAULT_BACKEND := cpu
else
  DEFAULT_BACKEND := cuda
endif
BACKEND ?= $(DEFAULT_BACKEND)

CC      := mpicc
ARCH    ?= -march=native
OPT     ?= -O3 $(ARCH)
CFLAGS  := $(OPT) -std=c11 -D_GNU_SOURCE -fopenmp -Wall -Wextra -Werror -Icommon -MMD -MP
LDLIBS  := -lm -lpthread -lxxhash -lzstd
# clang (macOS's cc; here OMPI_CC=clang mpicc) leaves the `omp simd`
# reduction(max) loops scalar (a float max by select needs no-NaN math to
# run in lanes) and says so in a warning: the result is the same
ifneq ($(findstring clang,$(shell $(CC) --version 2>/dev/null)),)
  CFLAGS += -Wno-pass-failed
endif

COMMON_SRC := common/errors.c common/rank.c common/exercise.c common/atomic_file.c common/memory.c common/model_layout.c common/model.c common/wgrad_queue.c common/init.c \
              common/model_file.c common/data.c common/mesh.c common/runtime.c common/matmul_peak.c \
              common/args.c common/report.c common/train.c common/train_eval.c common/train_step.c common/run.c common/train_loop.c common/comm_stats.c common/comm_trace.c common/comm_groups.c common/paths.c \
              common/ckpt.c common/ckpt_files.c common/ckpt_levels.c common/ckpt_whole.c common/model_tp.c common/trace.c \
              common/optime.c common/watchdog.c common/watch_mpi.c common/sharding.c

# the CPU backend: one file per op family (common/cpu/ops_*.c), the device, its clock, MPI
CPU_BACKEND_C := $(sort $(wildcard common/cpu/ops_*.c)) common/cpu/device.c common/cpu/device_clock.c common/cpu/comm.c

ifeq ($(BACKEND),cpu)
  BIN := $(BUILD)
  # OpenBLAS, the OpenMP build: one thread pool shared with our OpenMP loops,
  # and single-threaded when called inside a parallel region (attention heads)
  MULTIARCH := $(shell gcc -print-multiarch 2>/dev/null)
  BLAS_DIR  ?= /usr/lib/$(MULTIARCH)/openblas-openmp
  BLAS_INC  ?= /usr/include/$(MULTIARCH)/openblas-openmp
  ifneq ($(wildcard $(BLAS_DIR)/libopenblas.so),)
    CFLAGS += -I$(BLAS_INC)
    LDLIBS += -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas
  else
    LDLIBS += -lopenblas
  endif
  BACKEND_C  := $(CPU_BACKEND_C)
  BACKEND_CU :=
else ifeq ($(BACKEND),cuda)
  ifeq ($(HAVE_NVCC),)
    $(error BACKEND=cuda needs nvcc (the CUDA Toolkit): put it on PATH or in /usr/local/cuda/bin, or build with BACKEND=cpu)
  endif
  BIN := $(BUILD)/cuda
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(HAVE_NVCC))
  NVCC      ?= $(CUDA_HOME)/bin/nvcc
  # real code for T4 and RTX 20xx (sm_75: the free notebook GPUs students
  # start on), A100 (sm_80) and H100 (sm_90), and sm_90's PTX for newer GPUs
  # to compile at load; nvcc's own default (sm_75 alone) would make an H100
  # JIT-compile every kernel at the first launch. Each target costs build
  # time: sm_75's added 16% of a full build's CPU time (docs/cuda.md).
  CUDA_ARCH ?= -gencode arch=compute_75,code=sm_75 -gencode arch=compute_80,code=sm_80 \
               -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
  # --fmad=false: no fused multiply-adds, as gcc compiles the CPU twin, so the
  # two backends round the same formulas alike (reduction orders still differ).
  # -lineinfo: line tables for the device code, without changing its
  # optimisation, so that compute-sanitizer's reports (make gpu-check) name
  # the line of an ops_*.cu, not only the kernel
  NVCCFLAGS := -O3 --fmad=false -lineinfo $(CUDA_ARCH) -std=c++17 -Icommon -I$(CUDA_HOME)/include -Werror all-warnings \
               -Xcompiler -Wall,-Wextra,-Werror,-fopenmp -MMD -MP
  CFLAGS    += -I$(CUDA_HOME)/include
  LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lnccl -lcudart -lstdc++ -ldl
  BACKEND_C  := $(wildcard common/cuda/*.c)
  BACKEND_CU := $(wildcard common/cuda/*.cu)
else
  $(error BACKEND=$(BACKEND): choose cpu or cuda)
endif

OBJ := $(BUILD)/obj/$(BACKEND)
COMMON_OBJ := $(patsubst %.c,$(OBJ)/%.o,$(COMMON_SRC) $(BACKEND_C)) \
              $(patsubst %.cu,$(OBJ)/%.o,$(BACKEND_CU))
# The CPU ops promise gcc that no program watches floating-point traps or
# reads errno after a math call (none does): it may then vectorise loops that
# compare floats (exp_lanes's clamp in common/cpu/ops_cpu.h) or take a square root
# (AdamW). The values computed are the same, bit for bit.
$(OBJ)/common/cpu/ops_%.o: CFLAGS += -fno-trapping-math -fno-math-errno

# The flags are part of every object: a stamp file holds them and changes
# (so everything rebuilds) only when they do, e.g. a new OPT or CUDA_ARCH.
FLAGS_STAMP := $(OBJ)/flags.stamp
FLAGS_NOW := $(CC) $(CFLAGS) | $(NVCC) $(NVCCFLAGS) | $(LDLIBS)
$(shell mkdir -p $(OBJ) && (echo '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || echo '$(FLAGS_NOW)' > $(FLAGS_STAMP)))

# ---------------------------------------------------------------- chapters
# Every NN_name/main.c that exists becomes chapter-N. Every other
# NN_name/*.c is a module: the chapter's strategy engine (03_fsdp/fsdp.c).
# chapter-N links its main.c, the modules of its own directory, and the
# modules of earlier chapters it names in NN_name/modules (paths without .c,
# e.g. "03_fsdp/fsdp"). A chapter never links another chapter's main.c.
# A plain `make` builds everything (all), not the first rule it meets.
.DEFAULT_GOAL := all

# Chapters 2 and later name 01_collectives/collectives: linked, it registers
# chapter 1's hand-written collectives with the comm layer (--comm hand).
CHAPTER_DIRS := $(sort $(patsubst %/main.c,%,$(wildcard 0[0-7]_*/main.c)))
chapter_number = $(patsubst 0%,%,$(firstword $(subst _, ,$(1))))
CHAPTERS := $(foreach d,$(CHAPTER_DIRS),$(call chapter_number,$(d)))
MODULE_SRC := $(filter-out %/main.c,$(wildcard 0[0-7]_*/*.c))
own_modules = $(filter $(1)/%,$(MODULE_SRC:.c=))
declared_modules = $(if $(wildcard $(1)/modules),$(shell cat $(1)/modules))
chapter_modules = $(sort $(call own_modules,$(1)) $(call declared_modules,$(1)))

define CHAPTER_RULE
.PHONY: chapter-$(call chapter_number,$(1))
chapter-$(call chapter_number,$(1)): $(BIN)/chapter-$(call chapter_number,$(1))
$(BIN)/chapter-$(call chapter_number,$(1)): $(OBJ)/$(1)/main.o $(patsubst %,$(OBJ)/%.o,$(call chapter_modules,$(1))) $(COMMON_OBJ)
	@mkdir -p $$(dir $$@)
	$(CC) $(CFLAGS) -o $$@ $$^ $(LDLIBS)
$(OBJ)/$(1)/%.o: CFLAGS += $(patsubst %,-I%,$(sort $(dir $(call chapter_modules,$(1)))))
endef
$(foreach d,$(CHAPTER_DIRS),$(eval $(call CHAPTER_RULE,$(d))))

# ---------------------------------------------------------------- the capstone
# build/capstone trains chapter 7's MoE model on every axis at once (dp, ep,
# tp, cp, pp, --zero; docs/capstone.md). It is no chapter, so it sits in its
# own capstone/, outside the chapters' rule: it links capstone/*.c (the
# composition: the model on the mesh, the chunks, the step around the
# schedule's actions) and the chapters' modules named in capstone/modules,
# as a chapter names them; what it runs is theirs.
CAPSTONE_SRC := $(wildcard capstone/*.c)
CAPSTONE_MODULES := $(if $(wildcard capstone/modules),$(shell cat capstone/modules))
.PHONY: capstone-bin
capstone-bin: $(BIN)/capstone
# (an older make capstone left its step listing in a folder of the binary's
# name, build/capstone/: such a folder is not the program, so it goes and the
# program is linked, as make capstone writes build/capstone-step/ now)
CAPSTONE_OLD_DIR := $(if $(wildcard $(BIN)/capstone/.),capstone-old-dir)
.PHONY: capstone-old-dir
$(BIN)/capstone: $(patsubst %.c,$(OBJ)/%.o,$(CAPSTONE_SRC)) $(patsubst %,$(OBJ)/%.o,$(CAPSTONE_MODULES)) $(COMMON_OBJ) $(CAPSTONE_OLD_DIR)
	@mkdir -p $(dir $@)
	@if [ -d $@ ]; then echo "rm -r $@  (make capstone's old output folder; it writes build/capstone-step/ now)"; rm -r $@; fi
	$(CC) $(CFLAGS) -o $@ $(filter-out capstone-old-dir,$^) $(LDLIBS)
$(OBJ)/capstone/%.o: CFLAGS += $(patsubst %,-I%,$(sort $(dir $(CAPSTONE_MODULES))))

.PHONY: all modules test tests tools demo bench-ref bench-peer setup clean docs-check fuzz sanitize homework grade print-link-sources print-ldlibs
all: $(addprefix chapter-,$(CHAPTERS)) capstone-bin modules tools

# every module compiles, linked by a chapter or not yet
modules: $(patsubst %.c,$(OBJ)/%.o,$(MODULE_SRC))

tools: $(BIN)/tokenize $(BIN)/roofline $(BIN)/plan $(BIN)/attention_bench
$(BIN)/tokenize: $(OBJ)/common/tools/tokenize.o $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BIN)/roofline: $(OBJ)/common/tools/roofline.o $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
# the two attentions timed against each other, alternated (make bench)
$(BIN)/attention_bench: $(OBJ)/common/tools/attention_bench.o $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
# the planner: a chapter's peak bytes and communication, predicted (tests/plan.sh):
# tools/plan/*.c, and the chapters' own modules whose sizes and schedules it
# reads (PLAN_MODULES, paths without .c). A tool of the whole course, so it
# sits in the top-level tools/, neither in a chapter's folder nor in
# common/tools (it links every chapter's engine, and nothing in common/
# includes a chapter's header).
PLAN_MODULES := 05_pipeline/schedule 05_pipeline/pipeline 06_sequence_context/context 06_sequence_context/ring \
                06_sequence_context/sequence 04_fsdp_tp/tp 03_fsdp/fsdp 07_expert/moe capstone/composed_rules
$(BIN)/plan: $(patsubst %.c,$(OBJ)/%.o,$(wildcard tools/plan/*.c)) $(patsubst %,$(OBJ)/%.o,$(PLAN_MODULES)) $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(OBJ)/tools/plan/%.o: CFLAGS += -Itools/plan $(patsubst %,-I%,$(sort $(dir $(PLAN_MODULES))))

$(OBJ)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(OBJ)/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

# ---------------------------------------------------------------- tests
# The CPU tests always run on the CPU build; GPU tests run where a GPU is.
# Every tests/test_NAME.c is one test program, build/tests/test_NAME: it links
# common/ on the CPU backend and the chapter modules named on its source's
# line "// modules: 03_fsdp/fsdp ..." (as a chapter's NN_name/modules names
# them). tests/unit.sh runs each one whose source has no "// run by:" line
# (a test that needs MPI ranks or arguments names the script that runs it).
TESTS := $(patsubst tests/%.c,%,$(wildcard tests/test_*.c))
test_modules = $(shell sed -n 's|^// modules: *||p' tests/$(1).c)
CPU_COMMON_OBJ := $(patsubst %.c,$(BUILD)/obj/cpu/%.o,$(COMMON_SRC) $(CPU_BACKEND_C))
define TEST_RULE
$(BUILD)/tests/$(1): $(BUILD)/obj/cpu/tests/$(1).o $(patsubst %,$(BUILD)/obj/cpu/%.o,$(call test_modules,$(1))) $(CPU_COMMON_OBJ)
	@mkdir -p $$(dir $$@)
	$(CC) $(CFLAGS) -o $$@ $$^ $(LDLIBS)
$(BUILD)/obj/cpu/tests/$(1).o: CFLAGS += $(patsubst %,-I%,$(sort $(dir $(call test_modules,$(1)))))
endef
$(foreach t,$(TESTS),$(eval $(call TEST_RULE,$(t))))
tests: $(addprefix $(BUILD)/tests/,$(TESTS)) $(BUILD)/tests/libyield_sleep.so $(BUILD)/tests/libfail_create.so \
       $(BUILD)/tests/topology_xml
# the test runner's sched_yield (tests/yield_sleep.c says why), preloaded into
# the ranks by tests/lib.sh: built without OPT, so a sanitized build's copy
# does not carry the sanitizer runtime (which must come first when preloaded)
$(BUILD)/tests/libyield_sleep.so: tests/yield_sleep.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -shared -fPIC -o $@ $<
# a full disk for the files a test names (tests/fail_create.c), preloaded
# into two runs by tests/ckpt_levels.sh; built without OPT, as the one above
$(BUILD)/tests/libfail_create.so: tests/fail_create.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -shared -fPIC -o $@ $< -ldl
# the machine's topology as a file for the test runs' mpirun (tests/topology_xml.c
# says why); hwloc comes with Open MPI's development package
$(BUILD)/tests/topology_xml: tests/topology_xml.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -o $@ $< -lhwloc
$(BUILD)/obj/cpu/tests/%.o: CFLAGS += -Itests
ifeq ($(BACKEND),cuda)
# the op tests on the CUDA backend (tests/run.sh runs them where a GPU is)
$(BIN)/tests/test_ops: $(OBJ)/tests/test_ops.o $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
# the comm layer and the FSDP engine on GPU ranks (make gpu-check)
$(BIN)/tests/test_comm: $(OBJ)/tests/test_comm.o $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BIN)/tests/test_fsdp: $(OBJ)/tests/test_fsdp.o $(OBJ)/03_fsdp/fsdp.o $(OBJ)/03_fsdp/zero_buffer.o $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(OBJ)/tests/test_fsdp.o: CFLAGS += -I03_fsdp
endif

# The first-GPU-day script (tests/gpu_check.sh, docs/cuda.md section 6):
# every chapter and the capstone on 1-2 GPUs, the risky cases on 4, against
# the same runs on the CPU, each case under a limit with every rank's stacks
# on a hang; one table, and build/gpu-check.tar.gz to send back. Without a GPU
# it says so and skips; `make gpu-check GPU_CHECK_BACKEND=cpu` runs the same
# cases on the CPU build (the harness checked without a GPU).
.PHONY: gpu-check
gpu-check:
	@bash tests/gpu_check.sh

# tests/run.sh runs tests/unit.sh, every tests/chapter_N.sh, capstone.sh,
# plots.sh, gpu.sh; with CHAPTER=N only tests/chapter_N.sh (a word W:
# tests/W.sh, e.g. CHAPTER=capstone)
# The build before the tests uses every core (a plain `make test` after a
# change to common/ rebuilt every program one file at a time), unless make
# was given -j itself (its jobserver is shared then).
NPROC = $(shell nproc 2>/dev/null || echo 2)
test:
	@$(MAKE) --no-print-directory $(if $(filter -j% --jobserver%,$(MAKEFLAGS)),,-j$(NPROC)) BACKEND=cpu all tests
	@bash tests/run.sh $(CHAPTER)

# Every `path:N` reference, relative link and `<!-- check: CMD -->` figure of
# README.md and docs/*.md (docs/TEMPLATE.md says what is checked); make test
# runs it too. The checks run the CPU build's programs.
docs-check:
	@$(MAKE) --no-print-directory BACKEND=cpu all $(BUILD)/tests/libyield_sleep.so $(BUILD)/tests/topology_xml
	@python3 tests/docs_check.py

# The course as a website: every lesson, topic and note page, the plots in
# place, each `path:N` a link to a highlighted source page at that line, the
# traces zoomable; from the checkout, offline (tools/site/build.py). Open
# build/site/index.html. site-check opens every page in headless Chromium
# (tests/site_check.py), after its self-test on a deliberately broken copy.
.PHONY: site site-check
site:
	@SETUP_QUIET=1 bash .ci/install-deps.sh site
	@python3 tools/site/build.py
site-check: site
	@SETUP_QUIET=1 bash .ci/install-deps.sh site-check
	@python3 tests/site_check.py --self-test
	@python3 tests/site_check.py

# A --trace file as a Gantt chart: compute, communication and waiting per
# rank (docs/tracing.md). STEPS=FIRST:LAST picks the steps (default: the first
# two timed ones); OUT defaults to the trace's name with .png.
.PHONY: timeline
timeline:
	@test -n "$(TRACE)" || { echo "usage: make timeline TRACE=FILE.json [OUT=FILE.png] [STEPS=1:2]"; exit 2; }
	@python3 docs/plots/timeline.py "$(TRACE)" "$(or $(OUT),$(basename $(TRACE)).png)" "$(STEPS)" "$(TITLE)"
# ---------------------------------------------------------------- homework
# make homework CHAPTER=N [DEST=dir]: the student tree of chapter N (its
# EXERCISE regions stubbed out, HOMEWORK.md); make grade CHAPTER=N
# [EXERCISE=K]: builds and grades chapter N's exercises, last line
# "grade chapter N: S / T" (tests/homework/, docs/teaching.md).
homework:
	@python3 tests/homework/cut.py student "$(CHAPTER)" "$(or $(DEST),build/homework-$(CHAPTER))"
grade:
	@EXERCISE="$(EXERCISE)" SUBMISSION="$(SUBMISSION)" bash tests/homework/grade.sh "$(CHAPTER)"
# make grade-class CHAPTER=N SUBMISSIONS=DIR [CSV=file]: one student tree a
# folder of DIR, each exercise graded on its own (tests/homework/grade_class.sh)
.PHONY: grade-class
grade-class:
	@bash tests/homework/grade_class.sh "$(CHAPTER)" "$(SUBMISSIONS)" $(CSV)
# make homework-check: tests/homework.sh with every buggy variant of
# tests/homework/bugs/ (make test grades one a chapter; CI runs make test
# with HOMEWORK_BUGS=all, so every variant is graded on every CI run)
.PHONY: homework-check
homework-check:
	@$(MAKE) --no-print-directory BACKEND=cpu all tests
	@HOMEWORK_BUGS=all bash tests/run.sh homework

# ---------------------------------------------------------------- running
setup:
	@bash .ci/install-deps.sh

DEMO_STEPS ?= 300
demo: setup
	@$(MAKE) --no-print-directory all
	bash tests/mpirun.sh -np 1 $(BIN)/chapter-0 --model small --steps $(DEMO_STEPS) \
	    --val-every 100 --sample 400 --log build/demo.jsonl

# The machine's roofline (common/tools/roofline.c: matmul peak, copy bandwidth),
# then the reference's speed on the small preset, one rank: ms/step, tokens/s, MFU,
# then where the step went, op by op (common/optime.h; docs/performance.md).
bench-ref: all
	bash tests/mpirun.sh -np 1 $(BIN)/roofline
	bash tests/mpirun.sh -np 1 $(BIN)/chapter-0 --model small --steps 12 --log build/bench-ref.jsonl
	@python3 common/tools/op_breakdown.py build/bench-ref.jsonl

# The planner's machine profile of this machine (common/tools/measure_profile.sh:
# the roofline, attention, chapter 1's collectives fitted to alpha + bytes/busbw)
# into PROFILE (build/profile.txt); make plan-check predicts the committed
# sweep's runs with it and runs them (docs/planner.md). Benches: not in make test.
PROFILE ?= build/profile.txt
.PHONY: profile plan-check
profile: all
	@BIN=$(BIN) bash common/tools/measure_profile.sh $(PROFILE)
plan-check: all
	@BIN=$(BIN) PROFILE=$(PROFILE) bash common/tools/plan_check.sh

# The same model in PyTorch (installs Debian's python3-torch), alternated with
# chapters 0 and 2: tokens/s and ratios (common/tools/bench_peer.sh).
bench-peer: all
	@BIN=$(BIN) bash common/tools/bench_peer.sh

# The tiny tests under AddressSanitizer and UBSan, built into build/sanitize/
# (the flags are in the objects' stamp, so a sanitized build never mixes with
# the normal one).
SANITIZE_OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
sanitize:
	@$(MAKE) --no-print-directory BACKEND=cpu BUILD=build/sanitize OPT='$(SANITIZE_OPT)' all tests
	@BUILD=build/sanitize bash tests/sanitize.sh

# What another machine changes (tests/portability.sh; CI runs it): the docs'
# figures and one invariant run per chapter with OpenBLAS's Haswell kernels,
# with a build without -march=native and one by clang (it builds
# build/portable/ and build/clang/ itself; clang is installed as root, else
# install-deps prints the line and that leg skips) and with Open MPI over TCP
# on the loopback. Same as make test CHAPTER=portability.
.PHONY: portability
portability:
	@SETUP_QUIET=1 bash .ci/install-deps.sh portability || true
	@$(MAKE) --no-print-directory BACKEND=cpu all tests
	@bash tests/run.sh portability

# The whole of make test again with the OpenBLAS kernels of another CPU
# family (OPENBLAS_CORETYPE=$(OTHER_KERNELS); Sandybridge's: AVX without FMA,
# so other roundings than any recent CPU's kernels): a test whose claim holds
# with one BLAS's bits only fails here, not on a student's laptop. Kernels
# need what their CPU family has (Sandybridge's AVX, Haswell's AVX2,
# SkylakeX's AVX-512; Nehalem's and Prescott's SSE any x86-64 CPU has):
# where this CPU lacks it, or is no x86-64, a SKIP line. CI runs it.
OTHER_KERNELS ?= Sandybridge
.PHONY: test-kernels
test-kernels:
	@$(MAKE) --no-print-directory $(if $(filter -j% --jobserver%,$(MAKEFLAGS)),,-j$(NPROC)) BACKEND=cpu all tests
	@need=sse2; case "$(OTHER_KERNELS)" in \
	    Sandybridge|Bulldozer|Piledriver|Steamroller) need=avx;; Haswell|Zen|Excavator) need=avx2;; \
	    SkylakeX|Cooperlake|SapphireRapids) need=avx512f;; esac; \
	if [ "$$(uname -m)" = x86_64 ] && grep -qw "$$need" /proc/cpuinfo 2>/dev/null; then \
	    echo "== make test with OPENBLAS_CORETYPE=$(OTHER_KERNELS)"; OPENBLAS_CORETYPE=$(OTHER_KERNELS) bash tests/run.sh; \
	else echo "SKIP make test-kernels: OpenBLAS's $(OTHER_KERNELS) kernels need an x86-64 CPU with $$need, and this $$(uname -m) CPU has none"; fi

# Fuzz the loaders a user feeds files to (checkpoint, token file, text) with
# libFuzzer for FUZZ_SECONDS each (installs clang as root; not part of test).
fuzz:
	@bash tests/fuzz/run.sh

# The invariant on random layouts of the capstone for SWEEP_SECONDS (default
# 600) from SWEEP_SEED (default 1): dense against chapter 0, experts against
# one rank, each checkpoint resumed on another layout (tests/layout_sweep.sh;
# not part of test).
.PHONY: sweep-layouts
sweep-layouts:
	@$(MAKE) --no-print-directory $(if $(filter -j% --jobserver%,$(MAKEFLAGS)),,-j$(NPROC)) BACKEND=cpu all
	@bash tests/layout_sweep.sh

# What every program links: its sources and libraries (tests/fuzz/run.sh
# builds the fuzz targets from these, so its list cannot fall behind).
print-link-sources:
	@echo $(COMMON_SRC) $(BACKEND_C)
print-ldlibs:
	@echo $(LDLIBS)

# make bench (the sweep over chapters) and make plots live in docs/plots/.
-include docs/plots/plots.mk

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
