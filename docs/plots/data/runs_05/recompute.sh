#!/bin/bash
# docs/notes/05_pipeline.md, "Recompute, and against chapter 4": chapter 5
# with each --recompute mode (1F1B and ZB-H1, pp = 2, m = 4) beside chapters
# 2 and 4 on the same 2 ranks, the small model, one run right after the other
# (the machine is shared: runs far apart in time do not compare). From the
# repository root, after make all:
#   bash docs/plots/data/runs_05/recompute.sh
set -e
out=docs/plots/data/runs_05
T="--model small --steps 5 --val-batches 1 --peak-gflops 90.445"
run() { name=$1; np=$2; shift 2; bash tests/mpirun.sh -np $np "$@" $T --log $out/$name.jsonl > $out/$name.out 2>&1; echo "$name: $(grep "\"type\":\"summary\"" $out/$name.jsonl | grep -o "\"tokens_per_s\":[0-9.]*")"; }
uptime
run rc_ch2_dp2 2 build/chapter-2 --dp 2
run rc_ch4_tp2 2 build/chapter-4 --tp 2
run rc_ch5_1f1b_none 2 build/chapter-5 --pp 2 --microbatches 4
run rc_ch5_1f1b_selective 2 build/chapter-5 --pp 2 --microbatches 4 --recompute selective
run rc_ch5_1f1b_full 2 build/chapter-5 --pp 2 --microbatches 4 --recompute full
run rc_ch5_zb_full 2 build/chapter-5 --pp 2 --schedule zb --microbatches 4 --recompute full
run rc_ch5_1f1b_none_again 2 build/chapter-5 --pp 2 --microbatches 4
uptime
