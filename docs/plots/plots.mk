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

# make capstone [NP=8] [MESH="--dp 2 --cp 2 --ep 2 --experts 4 --top-k 2"] [DOCS=1]
# One training step's collectives on a multi-axis mesh, per group and in the
# order a rank issues them (docs/capstone.md): chapter 7 on NP ranks with
# MESH, 3 steps of the test model with --trace, then docs/plots/step_comm.py
# on rank 0's step 1: the listing in build/capstone/step.txt and the picture
# in build/capstone/step.png (DOCS=1: docs/plots/capstone_step.png, the
# page's figure). Another mesh is another MESH: the rows are the groups the
# trace names.
CAPSTONE_NP = $(or $(NP),8)
CAPSTONE_MESH = $(or $(MESH),--dp 2 --cp 2 --ep 2 --experts 4 --top-k 2)
CAPSTONE_PNG = $(if $(filter-out 0,$(DOCS)),docs/plots/capstone_step.png,build/capstone/step.png)
.PHONY: capstone
capstone: chapter-7
	@mkdir -p build/capstone
	bash tests/mpirun.sh -np $(CAPSTONE_NP) $(BIN)/chapter-7 $(CAPSTONE_MESH) --batch 24 --seq 32 --steps 3 --peak-gflops 10 --trace build/capstone/trace.json --log build/capstone/trace.jsonl > build/capstone/run.txt
	python3 docs/plots/step_comm.py build/capstone/trace.json $(CAPSTONE_PNG) --step 1 --title "chapter 7 $(CAPSTONE_MESH), test model" | tee build/capstone/step.txt
