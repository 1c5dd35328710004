#!/bin/bash
# How much of the ring's communication the overlap hides (docs/notes/06_sequence_context.md):
# cp=2 ring on the small model, one rank per core, the ring's K/V overlapped with the
# attention (--cp-overlap 1) or waited for first (0), alternating, twice each; with the
# plain cut (BAL=none) rank 0 waits mostly for rank 1's larger share, with zigzag
# (BAL=zigzag, the default) the two ranks' work is equal.
# RUNS="3 4" numbers further pairs.
# Run from the repository's root after make all.
cd "$(dirname "$0")/../../../../.."
out=docs/plots/data/ch6/overlap
bal=${BAL:-zigzag}
for i in ${RUNS:-1 2}; do for o in 1 0; do
    bash tests/mpirun.sh -np 2 build/chapter-6 --cp 2 --cp-balance $bal --model small --batch 4 --seq 256 --steps 6 \
        --threads 1 --val-batches 1 --peak-gflops 10 --cp-overlap $o --log $out/small_cp2_${bal}_overlap${o}_run$i.jsonl \
        > $out/small_cp2_${bal}_overlap${o}_run$i.out 2>&1
done; done
