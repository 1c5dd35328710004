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
