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
# over when there is none. With --ckpt-local L in the command as well, a
# restart adds --resume DIR whenever either level holds a complete step:
# the program takes the newest usable step of level 1 or 3 and says which,
# falling back across level-1 steps with a note; once a level-3 step was
# refused, --resume names the newest level-3 step left (a newer level-1 step
# still wins), or L when none is left (level 1 alone). MPIRUN overrides the
# launcher (default: tests/mpirun.sh, which oversubscribes).
#
# What it retries: a crash or a kill, up to R times: any exit but 0, and
# exit 1 too unless the job printed an `error:` line. Exit 1 with one is the
# programs' refusal of their input (a bad flag, a mesh that does not fit, a
# corrupt file): the same command would fail the same way, so it is not
# retried, with one exception: when the refusal names the checkpoint the
# attempt resumed from (its manifest or one of its files is corrupt,
# truncated or missing), that checkpoint is skipped, with the reason
# printed, and the attempt is made again from the next older one; skipping
# does not use up a retry. The first attempt too, when the command carries
# its own --resume (a requeued job's): the supervisor's choice replaces it
# once a checkpoint was skipped. A SIGTERM or SIGINT to the supervisor itself
# goes to the job and ends both, with no restart; one to the job alone (a
# scheduler's) is a failure like a kill and is retried. Exits with the
# job's status: 0 once an attempt succeeds, else the status of the last
# failure.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
MPIRUN=${MPIRUN:-bash $here/tests/mpirun.sh}
retries=3 np=1 fallback=""
# number FLAG VALUE MIN: VALUE, a whole number >= MIN, or one error line and exit 2
# (a --retries of "abc" made every comparison fail: restarts without end)
number() {
    [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] && [ "$2" -le 1000000 ] && return
    echo "supervise.sh: $1 needs a whole number from $3 to 1000000, got '$2'" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case $1 in
        --retries | --np | --fallback-np)
            [ $# -ge 2 ] || { echo "supervise.sh: $1 needs a value" >&2; exit 2; }
            case $1 in
                --retries) number "$1" "$2" 0; retries=$2 ;;
                --np) number "$1" "$2" 1; np=$2 ;;
                --fallback-np) number "$1" "$2" 1; fallback=$2 ;;
            esac
            shift 2 ;;
        --) shift; break ;;
        *) echo "supervise.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "supervise.sh: no command after --" >&2; exit 2; }
cmd=("$@")
dir="" local_dir=""
for ((i = 0; i < ${#cmd[@]} - 1; i++)); do
    [ "${cmd[$i]}" = --ckpt-dir ] && dir=${cmd[$((i + 1))]}
    [ "${cmd[$i]}" = --ckpt-local ] && local_dir=${cmd[$((i + 1))]}
done
[ -n "$dir" ] || { echo "supervise.sh: the command needs --ckpt-dir DIR (where restarts resume from)" >&2; exit 2; }
# the command's own --resume (a requeued job's): the first attempt resumes
# as it says, so a refusal of the checkpoint it picked is skipped as a
# restart's is; from then on the supervisor's choice replaces it
own_resume="" plain=()
for ((i = 0; i < ${#cmd[@]}; i++)); do
    if [ "${cmd[$i]}" = --resume ] && [ $i -lt $((${#cmd[@]} - 1)) ]; then
        own_resume=${cmd[$((i + 1))]}
        i=$((i + 1))
    else
        plain+=("${cmd[$i]}")
    fi
done

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

# level 1 (--ckpt-local L): any complete step on any node's directory
local_steps() { [ -n "$local_dir" ] && ls -d "$local_dir"/node-*/step-*/MANIFEST >/dev/null 2>&1; }

attempt=0 n=$np log=$(mktemp) job="" stopping=""
trap 'rm -f "$log"' EXIT
# a signal to the supervisor: the job gets it too, and nothing restarts
trap 'stopping=TERM; [ -n "$job" ] && kill -TERM "$job" 2>/dev/null' TERM
trap 'stopping=INT; [ -n "$job" ] && kill -INT "$job" 2>/dev/null' INT
while :; do
    args=("${cmd[@]//\{np\}/$n}")
    resume=$own_resume
    if [ $attempt -gt 0 ] || [ "$skipped" != $'\n' ]; then
        args=("${plain[@]//\{np\}/$n}")
        resume=$(newest_usable)
        if [ -n "$local_dir" ] && { [ -n "$resume" ] || local_steps; }; then
            # the program picks the newest usable step of either level, at or
            # above the level-3 step it is given
            if [ "$skipped" = $'\n' ]; then resume=$dir; elif [ -z "$resume" ]; then resume=$local_dir; fi
            args+=(--resume "$resume")
        elif [ -n "$resume" ]; then
            args+=(--resume "$resume")
        else
            echo "supervise: no usable checkpoint in $dir${local_dir:+ or $local_dir}: starting over"
        fi
    fi
    echo "supervise: attempt $((attempt + 1)) on $n rank(s): ${args[*]}"
    # in the background, so a signal to the supervisor reaches it at once
    $MPIRUN -np "$n" "${args[@]}" > >(tee "$log") 2>&1 &
    job=$!
    rc=0
    wait $job || rc=$?
    while kill -0 "$job" 2>/dev/null; do wait $job; rc=$?; done  # a trapped signal interrupted wait
    job=""
    wait  # tee has written the whole log
    if [ -n "$stopping" ]; then
        echo "supervise: stopped by SIG$stopping (exit $rc); the job was ended, nothing restarts" >&2
        exit $rc
    fi
    [ $rc -eq 0 ] && { echo "supervise: attempt $((attempt + 1)) succeeded"; exit 0; }
    reason=$(grep -m1 '^error: ' "$log")
    if [ $rc -eq 1 ] && [ -n "$reason" ]; then  # a refusal says why; an exit 1 without a word is a kill (mpirun's on SIGTERM)
        refused=""  # the newest level-3 checkpoint the refusal names: one of its files, or (a delta's broken chain) itself
        while read -r c; do
            [ -n "$c" ] && [[ $reason == *"$c/"* || ( $reason == *"is a delta against"* && $reason == *"$c'"* ) ]] &&
                [[ $skipped != *$'\n'"$c"$'\n'* ]] && { refused=$c; break; }
        done < <(checkpoints "$dir")
        if [ -n "$resume" ] && [ -n "$refused" ]; then
            echo "supervise: skipping checkpoint $refused, which the job refused: $reason" >&2
            skipped+="$refused"$'\n'
            continue
        fi
        echo "supervise: the job refused its input (exit 1: $reason); it would fail the same way again, so no restart" >&2
        exit 1
    fi
    attempt=$((attempt + 1))
    if [ $attempt -gt "$retries" ]; then
        echo "supervise: attempt $attempt failed (exit $rc); no retries left" >&2
        exit $rc
    fi
    n=${fallback:-$np}
    echo "supervise: attempt $attempt failed (exit $rc); restarting on $n rank(s) from the newest usable checkpoint in $dir${local_dir:+ or $local_dir}" >&2
done
