#!/bin/bash
# Chapter 1: collectives by hand against the library, the ring trace, the
# bench and its bus-bandwidth factors, bad input, --help.
. "$(dirname "$0")/lib.sh"

echo "== chapter 1: collectives by hand"
# every algorithm against the exact result and the library, odd counts,
# both roots, integer and random data; all-to-all-v against the exact blocks;
# COMM_AVG against sum/p; non-blocking forms; the counters of every collective.
# 6: two ranks past a power of two (recursive doubling folds both in: at 3
# and 5 one rank, where a wrong fold-in index reads the same)
for np in 1 2 3 4 5 6 8; do
    mpi_run $T_RUN $np "$BUILD/chapter-1" --check
    if [ $RC -eq 0 ] && echo "$OUT" | grep -q "check summary: \([0-9]*\) of \1 collective runs match on $np ranks$"; then
        pass "collectives on $np ranks: $(echo "$OUT" | grep 'check summary' | sed 's/check summary: //')"
    else
        fail "collectives on $np ranks" "exit $RC; command: $CMD; $(echo "$OUT" | grep -E 'FAIL|summary|error' | head -5)"
    fi
done
# the trace shows p-1 ring steps per rank for reduce-scatter: p(p-1) lines
mpi_run $T_SHORT 4 "$BUILD/chapter-1" --trace
n=$(echo "$OUT" | sed -n '/^== reduce_scatter/,/^$/p' | grep -c 'sends chunk')
if [ "$n" = 12 ] && echo "$OUT" | grep -q "step 2: rank 3 sends chunk 0 to rank 0, adds chunk 3 from rank 2"; then
    pass "collectives: --trace on 4 ranks shows the 12 messages of the ring reduce-scatter"
else
    fail "collectives: --trace" "$n ring lines; command: $CMD; $(echo "$OUT" | head -12)"
fi
# --op chooses what --trace shows too (it traced all nine)
mpi_run $T_SHORT 2 "$BUILD/chapter-1" --trace --op broadcast
if [ "$RC" = 0 ] && [ "$(echo "$OUT" | grep -c '^== ')" = 1 ] && echo "$OUT" | grep -q '^== broadcast: '; then
    pass "collectives: --trace --op broadcast traces the broadcast alone"
else
    fail "collectives: --trace --op" "exit $RC; $(echo "$OUT" | grep '^== ' | tr '\n' ';')"
fi
# the pairwise all-to-all's messages, each named as it moves: at step s rank
# r sends its block for rank r+s+1 there and receives its own block (r)
# from rank r-s-1 (mod p), on 3 ranks
mpi_run $T_SHORT 3 "$BUILD/chapter-1" --trace --op alltoall
want=$(for s in 0 1; do for r in 0 1 2; do
    echo "  step $s: rank $r sends its block $(((r + s + 1) % 3)) to rank $(((r + s + 1) % 3)), receives block $r of rank $(((r - s + 2) % 3))"
done; done)
if [ $RC = 0 ] && [ "$(echo "$OUT" | grep '^  step ' | sort)" = "$(echo "$want" | sort)" ]; then
    pass "collectives: --trace --op alltoall on 3 ranks names each of the 6 messages' blocks and peers"
else
    fail "collectives: --trace --op alltoall" "exit $RC; $(diff <(echo "$OUT" | grep '^  step ' | sort) <(echo "$want" | sort) | head -4)"
fi
# an empty --op matched every algorithm
mpi_run --may-fail $T_SHORT 2 "$BUILD/chapter-1" --op ""
if [ "$RC" = 1 ] && [ "$(echo "$OUT" | grep -c '^error: ')" = 1 ] && echo "$OUT" | grep -q "^error: --op '' names nothing"; then
    pass "collectives: an empty --op is refused with one line"
else
    fail "collectives: an empty --op" "exit $RC; $(echo "$OUT" | head -3)"
fi
# the bench runs, finds nothing wrong, and writes the rows the plots read
blog=$TEST_TMPDIR/bench.jsonl
mpi_run $T_RUN 2 "$BUILD/chapter-1" --bench --min-bytes 8 --max-bytes 64K --iters 3 --log "$blog"
rows=$(grep -c '"type":"collective"' "$blog" 2>/dev/null)
if [ $? -eq 0 ] && [ "$rows" -ge 90 ] && ! grep -q '"hand_wrong":[1-9]' "$blog" && ! grep -q '"lib_wrong":[1-9]' "$blog" &&
    grep '"type":"collective"' "$blog" | head -1 | grep -q '"hand_busbw":.*"lib_busbw":' && grep -q '"type":"copy_bandwidth"' "$blog"; then
    pass "collectives: --bench writes $rows rows, none wrong, with busbw for hand and library"
else
    fail "collectives: --bench" "$rows rows; command: $CMD; $(echo "$OUT" | tail -5)"
fi
# busbw = algbw * nccl-tests' factor, written out here independently of the
# program: 2(p-1)/p for all-reduce (both algorithms), (p-1)/p for
# reduce-scatter, all-gather, scatter, gather and all-to-all, 1 for broadcast
# and reduce; and algbw = bytes / time. Checked for hand and library columns
# of every row whose algbw is large enough (>= 0.001 GB/s) for the 5 printed
# decimals to tell the factors apart: two rounded values are off by at most
# 0.5e-5 (1 + f) < 2e-5 whatever their size, and at 0.001 GB/s the closest
# wrong factor (off by 1/p or more) is off by 2.5e-4 or more. Every op must
# have such a row. 2 ranks from the bench above; 3 and
# 4 ranks from 64 to 256 KiB (on 2 ranks all-reduce, broadcast and reduce
# share the factor 1, so only more ranks tell them apart). Three sizes, not
# one, and 0.001 GB/s rather than 0.01: on a loaded machine a 64 KiB
# all-reduce on 4 ranks once took over 6.5 ms (algbw < 0.01) and a whole
# 2-rank all-gather sweep once fell below 0.01 GB/s, leaving the op no usable
# row although nothing was wrong.
busbw_factors() {  # JSONL file, ranks -> "ok N" or a complaint
    grep '"type":"collective"' "$1" | awk -v P="$2" '
        function field(name,   m) {
            if (!match($0, "\"" name "\":[^,}]*")) return "";
            m = substr($0, RSTART, RLENGTH); sub(/^[^:]*:/, "", m); gsub(/"/, "", m); return m
        }
        BEGIN { split("allreduce_ring allreduce_doubling reduce_scatter allgather broadcast reduce scatter gather alltoall", ops, " ") }
        {
            op = field("op"); p = field("ranks") + 0; bytes = field("bytes") + 0
            if (p != P) { bad = bad " " op ":ranks=" p; next }
            if (op ~ /^allreduce_/) f = 2 * (p - 1) / p
            else if (op == "broadcast" || op == "reduce") f = 1
            else if (op == "reduce_scatter" || op == "allgather" || op == "scatter" || op == "gather" || op == "alltoall") f = (p - 1) / p
            else { bad = bad " unknown-op:" op; next }
            for (s = 0; s < 2; s++) {
                side = s ? "lib" : "hand"
                alg = field(side "_algbw") + 0; bus = field(side "_busbw") + 0; us = field(side "_us") + 0
                if (alg < 0.001) continue
                d = bus - f * alg; if (d < 0) d = -d
                # time is printed to 0.001 us and algbw to 0.00001 GB/s: algbw must lie
                # in the interval those roundings leave
                lo = bytes / ((us + 0.0005) * 1000) - 0.000005; hi = us > 0.0005 ? bytes / ((us - 0.0005) * 1000) + 0.000005 : 1e30
                if (d > 2e-5) bad = bad sprintf(" %s/%s@%d:busbw=%s,algbw*%.4f=%.5f", op, side, bytes, bus, f, f * alg)
                if (alg < lo || alg > hi) bad = bad sprintf(" %s/%s@%d:algbw=%s,bytes/time=%.5f", op, side, bytes, alg, bytes / (us * 1000))
                checked[op]++; n++
            }
        }
        END {
            for (i = 1; i <= 9; i++) if (!checked[ops[i]]) bad = bad " no-usable-row:" ops[i]
            if (bad != "") print "bad" bad; else print "ok " n
        }'
}
res=$(busbw_factors "$blog" 2)
if [ "${res%% *}" = ok ]; then
    pass "collectives: busbw = algbw x nccl-tests factor and algbw = bytes/time, every op, 2 ranks (${res#ok } values)"
else
    fail "collectives: bus factors on 2 ranks" "$res"
fi
for np in 3 4; do
    flog=$TEST_TMPDIR/bench_np$np.jsonl
    mpi_run $T_SHORT $np "$BUILD/chapter-1" --bench --min-bytes 64K --max-bytes 256K --iters 3 --log "$flog"
    res=$(busbw_factors "$flog" $np)
    if [ "${res%% *}" = ok ]; then
        pass "collectives: busbw = algbw x nccl-tests factor and algbw = bytes/time, every op, $np ranks (${res#ok } values)"
    else
        fail "collectives: bus factors on $np ranks" "$res; command: $CMD"
    fi
done

echo "== chapter 1: errors and --help"
jobs_run error_case chapter-1 2 "--steps 3" "unknown flag --steps"
jobs_run error_case chapter-1 2 "--max-bytes 12Q" "is not a size"
# decimal digits only: strtod read "64.9" as 64 and "0x40" in hex
jobs_run error_case chapter-1 2 "--max-bytes 64.9" "--max-bytes '64.9' is not a size from 4 to 1G"
jobs_run error_case chapter-1 2 "--min-bytes 0x40" "--min-bytes '0x40' is not a size from 4 to 1G"
jobs_run error_case chapter-1 1 "--bench --min-bytes 1M --max-bytes 1K" "larger than --max-bytes"
# --threads as every chapter checks it (common/args.c)
jobs_run error_case chapter-1 2 "--check --op broadcast --threads -5" "--threads must be between 0 (cores / ranks) and 1024"
jobs_run error_case chapter-1 1 "--check --op broadcast --threads 100000" "--threads must be between 0 (cores / ranks) and 1024"
jobs_run help_case chapter-1 "--trace"
jobs_wait  # independent: 2 at a time (jobs_run, tests/lib.sh)

finish
