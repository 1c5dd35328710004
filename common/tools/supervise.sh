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
# --ckpt-dir DIR; a restart adds --resume DIR when DIR holds a complete
# checkpoint (else it starts over). MPIRUN overrides the launcher
# (default: tests/mpirun.sh, which oversubscribes). Exits with the job's
# status: 0 once an attempt succeeds, the last failure's after R restarts.
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

# a complete checkpoint: a step-N directory with its MANIFEST (written last)
has_checkpoint() { ls "$1"/step-*/MANIFEST >/dev/null 2>&1; }

attempt=0 n=$np
while :; do
    args=("${cmd[@]//\{np\}/$n}")
    if [ $attempt -gt 0 ] && has_checkpoint "$dir"; then args+=(--resume "$dir"); fi
    echo "supervise: attempt $((attempt + 1)) on $n rank(s): ${args[*]}"
    $MPIRUN -np "$n" "${args[@]}"
    rc=$?
    [ $rc -eq 0 ] && { echo "supervise: attempt $((attempt + 1)) succeeded"; exit 0; }
    attempt=$((attempt + 1))
    if [ $attempt -gt "$retries" ]; then
        echo "supervise: attempt $attempt failed (exit $rc); no retries left" >&2
        exit $rc
    fi
    n=${fallback:-$np}
    echo "supervise: attempt $attempt failed (exit $rc); restarting on $n rank(s) from the last checkpoint in $dir" >&2
done
