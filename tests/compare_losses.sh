#!/bin/bash
# compare_losses.sh REF.jsonl RUN.jsonl TOL [FIELD]: compares FIELD ("loss"
# unless given, e.g. "norm") of every step record of two runs. Prints the
# largest absolute difference; exits 0 when the runs have the same steps,
# every step record carries the field, and every difference is <= TOL.
ref=$1 run=$2 tol=$3 field=${4:-loss}
# "step field" per step record; a record without the field prints "step ?"
extract() {
    grep '"type":"step"' "$1" | sed -e "s/.*\"step\":\([0-9]*\),.*\"$field\":\([-0-9.e]*\)[,}].*/\1 \2/" \
        -e 't' -e 's/.*"step":\([0-9]*\),.*/\1 ?/'
}
paste <(extract "$ref") <(extract "$run") | awk -v tol="$tol" -v field="$field" '
    { n++; if ($1 != $3 || $2 == "?" || $4 == "?" || $2 == "" || $4 == "") { bad_step = 1; next }
      d = $2 - $4; if (d < 0) d = -d; if (d > max) max = d }
    END { printf "%d steps, max |d%s| %.2e%s\n", n, field, max,
                 bad_step ? " (the step numbers differ or a record lacks \"" field "\")" : ""
          exit (n >= 1 && !bad_step && max <= tol) ? 0 : 1 }'
