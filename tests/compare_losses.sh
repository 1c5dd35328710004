#!/bin/bash
# compare_losses.sh REF.jsonl RUN.jsonl TOL: compares the "loss" of every
# step record of two runs. Prints the largest absolute difference; exits 0
# when the runs have the same steps and every difference is <= TOL.
ref=$1 run=$2 tol=$3
extract() { grep '"type":"step"' "$1" | sed 's/.*"step":\([0-9]*\),"loss":\([-0-9.e]*\).*/\1 \2/'; }
paste <(extract "$ref") <(extract "$run") | awk -v tol="$tol" '
    { n++; if ($1 != $3) bad_step = 1
      d = $2 - $4; if (d < 0) d = -d; if (d > max) max = d }
    END { printf "%d steps, max |dloss| %.2e\n", n, max
          exit (n >= 1 && !bad_step && max <= tol) ? 0 : 1 }'
