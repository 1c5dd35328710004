#!/bin/bash
# supervise.sh: runs a training job and, when it fails (a rank killed, a node
# lost), starts it again from the last complete checkpoint, optionally on
# fewer ranks: the checkpoint reshards onto the new mesh (docs/checkpoints.md).
#
#   common/tools/supervise.sh [--retries R] [--np N] [--fallback-np M] -- \
#       build/chapter-3 --dp {np} --zero 3 --steps 50 --ckpt-dir ckpt --save-every 10
#
# {np} in the command stands for the number of ranks of the current attempt:
# N on the first, M (default N) on every restart. The command must carry
# --ckpt-dir DIR; a restart adds --resume DIR/step-K, the newest complete
# checkpoint (a step directory with its MANIFEST) not found bad, or starts
# over when there is none. MPIRUN overrides the launcher (default:
# tests/mpirun.sh, which oversubscribes).
#
# What it retries: a crash or a kill (any exit but 0 and 1), up to R times.
# Exit 1 is the programs' refusal of their input (a bad flag, a mesh that
# does not fit, a corrupt file): the same command would fail the same way,
# so it is not retried, with one exception: when the refusal names the
# checkpoint the attempt resumed from (its manifest or one of its files is
# corrupt, truncated or missing), that checkpoint is skipped, with the
# reason printed, and the attempt is made again from the next older one;
# skipping does not use up a retry. Exits with the job's status: 0 once an
# attempt succeeds, else the status of the last failure.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
MPIRUN=${MPIRUN:-bash $here/tests/mpirun.sh}
retries=3 np=1 fallback=""
while [ $# -gt 0 ]; do
    case $1 in
        --retries) retries=$2; shift 2 ;;
        --np) np=$2; shift 2 ;;
        --fallback-np) fallback=$2; shift 2 ;;
        --) shift; break ;;
        *) echo "supervise.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "supervise.sh: no command after --" >&2; exit 2; }
cmd=("$@")
dir=""
for ((i = 0; i < ${#cmd[@]} - 1; i++)); do
    [ "${cmd[$i]}" = --ckpt-dir ] && dir=${cmd[$((i + 1))]}
done
[ -n "$dir" ] || { echo "supervise.sh: the command needs --ckpt-dir DIR (where restarts resume from)" >&2; exit 2; }

# the complete checkpoints of DIR, newest first: step-N directories with
# their MANIFEST (written last, so its presence means the save finished)
checkpoints() { ls -d "$1"/step-*/MANIFEST 2>/dev/null | sed 's|/MANIFEST$||' | sort -r; }
skipped=$'\n'  # checkpoints a refusal named, one a line
newest_usable() {
    local c
    while read -r c; do
        [ -n "$c" ] && [[ $skipped != *$'\n'"$c"$'\n'* ]] && { echo "$c"; return; }
    done < <(checkpoints "$dir")
}

attempt=0 n=$np log=$(mktemp)
trap 'rm -f "$log"' EXIT
while :; do
    args=("${cmd[@]//\{np\}/$n}")
    resume=""
    if [ $attempt -gt 0 ]; then
        resume=$(newest_usable)
        if [ -n "$resume" ]; then args+=(--resume "$resume"); else echo "supervise: no usable checkpoint in $dir: starting over"; fi
    fi
    echo "supervise: attempt $((attempt + 1)) on $n rank(s): ${args[*]}"
    $MPIRUN -np "$n" "${args[@]}" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    [ $rc -eq 0 ] && { echo "supervise: attempt $((attempt + 1)) succeeded"; exit 0; }
    if [ $rc -eq 1 ]; then
        reason=$(grep -m1 '^error' "$log")
        if [ -n "$resume" ] && [[ $reason == *"$resume"* ]]; then
            echo "supervise: skipping checkpoint $resume, which the job refused: $reason" >&2
            skipped+="$resume"$'\n'
            continue
        fi
        echo "supervise: the job refused its input (exit 1: ${reason:-no error line}); it would fail the same way again, so no restart" >&2
        exit 1
    fi
    attempt=$((attempt + 1))
    if [ $attempt -gt "$retries" ]; then
        echo "supervise: attempt $attempt failed (exit $rc); no retries left" >&2
        exit $rc
    fi
    n=${fallback:-$np}
    echo "supervise: attempt $attempt failed (exit $rc); restarting on $n rank(s) from the newest usable checkpoint in $dir" >&2
done
