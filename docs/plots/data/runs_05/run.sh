#!/bin/bash
# The same-time comparison of docs/notes/05_pipeline.md: chapter 5 against
# chapters 2 and 3 at the same rank counts, on the small model, one run right
# after the other (the machine is shared: runs far apart in time do not
# compare). From the repository root, after make all:
#   bash docs/plots/data/runs_05/run.sh
set -e
out=docs/plots/data/runs_05
T="--model small --steps 5 --val-batches 1 --peak-gflops 90.445"
run() { name=$1; np=$2; shift 2; bash tests/mpirun.sh -np $np "$@" $T --log $out/$name.jsonl > $out/$name.out 2>&1; echo "$name: $(grep "\"type\":\"summary\"" $out/$name.jsonl | grep -o "\"tokens_per_s\":[0-9.]*")"; }
run ch2_overlapped_dp2 2 build/chapter-2 --dp 2
run ch3_zero3_dp2 2 build/chapter-3 --dp 2 --zero 3
run ch5_1f1b_pp2 2 build/chapter-5 --pp 2 --microbatches 4
run ch5_zb_pp2 2 build/chapter-5 --pp 2 --schedule zb --microbatches 4
run ch2_overlapped_dp2_again 2 build/chapter-2 --dp 2
uptime
