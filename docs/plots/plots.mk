# plots.mk: the sweep over chapters and its plots (the Makefile includes this).
#
#   make bench   runs docs/plots/bench.sh: the fixed sweep on the `small` preset
#                over the chapters whose build/chapter-N exists, one JSONL file per
#                run in docs/plots/data/ (about 10 minutes on 2 cores)
#   make plots   draws the plots from docs/plots/data/ with gnuplot into
#                build/plots/*.png (docs/plots/plots.sh; never runs the sweep;
#                takes seconds); the figures the docs show stay as they are
#   make bench-ckpt  runs common/tools/ckpt_levels_bench.sh: each checkpoint
#                level and mode, twice, alternated, one JSONL file per run in
#                docs/plots/data/ckpt/ (a few minutes); make plots draws
#                ckpt_levels.png from them
#   make docs-plots, or make plots DOCS=1
#                the same, into docs/plots/*.png: refreshes the docs' figures
#                (commit them with the data they were drawn from)
#
# The tables gnuplot reads are written to build/plots/ (not committed).

.PHONY: bench bench-ckpt plots docs-plots

# Build what builds (a chapter being written may not compile yet: the sweep
# then leaves it out, or uses the binary that is there), then sweep.
bench:
	@$(MAKE) --no-print-directory -k all || echo "bench: some targets did not build; the sweep uses the binaries in $(BIN)/ that exist"
	@BIN=$(BIN) bash docs/plots/bench.sh

# the checkpoint levels' own runs (docs/checkpoints.md, "Measure it")
bench-ckpt: chapter-3
	@BIN=$(BIN) bash common/tools/ckpt_levels_bench.sh docs/plots/data/ckpt

PLOTS_OUT := $(if $(filter-out 0,$(DOCS)),docs/plots,build/plots)
plots:
	@bash docs/plots/plots.sh docs/plots/data build/plots $(PLOTS_OUT)

docs-plots:
	@bash docs/plots/plots.sh docs/plots/data build/plots docs/plots

# make capstone [NP=16] [MESH="--dp 2 --tp 2 --cp 2 --ep 2 --experts 4 --top-k 2"] [DOCS=1]
# One training step's collectives on a multi-axis mesh, per group and in the
# order a rank issues them (docs/capstone.md): build/capstone on NP ranks with
# MESH, 3 steps of the test model with --trace, then docs/plots/step_comm.py
# on rank 0's step 1: the listing in build/capstone-step/step.txt and the picture
# in build/capstone-step/step.png (not build/capstone/: that is the program).
# Another mesh is another MESH: the rows are the
# groups the trace names. DOCS=1: the page's files instead, rank 0's step 1
# trimmed from the trace into docs/plots/data/capstone/step1_rank0.json
# (what the page's listing is quoted from: its all-to-all bytes follow the
# routing, so another machine's rounding may differ) and the picture drawn
# from it into docs/plots/capstone_step.png.
CAPSTONE_NP = $(or $(NP),16)
CAPSTONE_MESH = $(or $(MESH),--dp 2 --tp 2 --cp 2 --ep 2 --experts 4 --top-k 2)
CAPSTONE_DOCS = $(filter-out 0,$(DOCS))
CAPSTONE_OUT = build/capstone-step
CAPSTONE_PNG = $(if $(CAPSTONE_DOCS),docs/plots/capstone_step.png,$(CAPSTONE_OUT)/step.png)
CAPSTONE_TRIM = docs/plots/data/capstone/step1_rank0.json
.PHONY: capstone
capstone: capstone-bin
	@mkdir -p $(CAPSTONE_OUT)
	bash tests/mpirun.sh -np $(CAPSTONE_NP) $(BIN)/capstone $(CAPSTONE_MESH) --batch 24 --seq 32 --steps 3 --peak-gflops 10 --trace $(CAPSTONE_OUT)/trace.json --log $(CAPSTONE_OUT)/trace.jsonl > $(CAPSTONE_OUT)/run.txt
	$(if $(CAPSTONE_DOCS),mkdir -p $(dir $(CAPSTONE_TRIM)) && python3 docs/plots/step_comm.py $(CAPSTONE_OUT)/trace.json --step 1 --trim $(CAPSTONE_TRIM) > /dev/null)
	python3 docs/plots/step_comm.py $(if $(CAPSTONE_DOCS),$(CAPSTONE_TRIM),$(CAPSTONE_OUT)/trace.json) $(CAPSTONE_PNG) --step 1 --title "capstone $(CAPSTONE_MESH), test model" | tee $(CAPSTONE_OUT)/step.txt
