#!/bin/bash
# ckpt_levels_bench.sh: what each checkpoint level costs (docs/checkpoints.md,
# "Levels"): the small model on chapter 3, dp 4 ZeRO-3, 4 simulated nodes of
# one rank, a save every 2 of 4 steps; level 1 with each redundancy (under
# /dev/shm), then level 3 (sync, under /tmp), two rounds alternated.
cd "$(dirname "$0")/../.."
D1=/dev/shm/ckpt_levels_bench.$$
D3=${TMPDIR:-/tmp}/ckpt_levels_bench.$$
F="--model small --steps 4 --batch 8 --seq 64 --peak-gflops 10 --dp 4 --zero 3"
for round in 1 2; do
  for mode in none partner xor l3; do
    rm -rf $D1 $D3; mkdir -p $D1
    if [ $mode = l3 ]; then extra="--ckpt-dir $D3 --save-every 2"; else extra="--ckpt-local $D1 --local-every 2 --ranks-per-node 1 --ckpt-redundancy $mode"; fi
    out=$(bash tests/mpirun.sh -np 4 build/chapter-3 $F $extra 2>&1)
    echo "round $round $mode: $(echo "$out" | grep -E '^checkpoint: (level 1:|[0-9]+ save)')"
    [ $mode = xor ] && ls -l $D1/node-1/step-00000002/ | awk '{print "   ", $5, $9}'
    [ $mode = partner ] && ls -l $D1/node-1/step-00000002/ | awk '{print "   ", $5, $9}'
  done
done
rm -rf $D1 $D3
uptime
