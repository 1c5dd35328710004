#!/bin/bash
# compare_losses.sh REF.jsonl RUN.jsonl TOL [FIELD]: compares FIELD ("loss"
# unless given, e.g. "norm") of every step record of two runs. Prints the
# largest absolute difference; exits 0 when the runs have the same steps,
# every step record carries the field, and every difference is <= TOL.
ref=$1 run=$2 tol=$3 field=${4:-loss}
# "step field" per step record; a record without the field prints "step ?"
extract() {
    [ -f "$1" ] || return 0  # a run that died before its log: no records (said below), not grep's error
    grep '"type":"step"' "$1" | sed -e "s/.*\"step\":\([0-9]*\),.*\"$field\":\([-0-9.e]*\)[,}].*/\1 \2/" \
        -e 't' -e 's/.*"step":\([0-9]*\),.*/\1 ?/'
}
paste <(extract "$ref") <(extract "$run") | awk -F'\t' -v tol="$tol" -v field="$field" '
    # $1: "step value" of the reference, $2: of the run (empty past its last record)
    { n++; split($1, r, " "); split($2, q, " ")
      if ($1 != "") nref++
      if ($2 != "") nrun++
      if (r[1] != q[1] || r[2] == "?" || q[2] == "?" || r[2] == "" || q[2] == "") { bad_step = 1; next }
      d = r[2] - q[2]; if (d < 0) d = -d; if (d > max) max = d
      # the first step over the tolerance, both figures: where a run first
      # leaves the reference (the loss of step 0 is forward alone; its norm
      # is the first figure backward makes)
      if (d > tol && first == "") first = sprintf(" (first over %s at step %s: %s, the reference %s)", tol, r[1], q[2], r[2]) }
    END { why = ""
          if (bad_step) why = nrun < nref ? sprintf(" (the run logged %d of the reference'"'"'s %d steps)", nrun, nref) \
                                          : " (the step numbers differ or a record lacks \"" field "\")"
          printf "%d steps, max |d%s| %.2e%s%s\n", n, field, max, first, why
          exit (n >= 1 && !bad_step && max <= tol) ? 0 : 1 }'
