#!/bin/bash
# Chapter 6: context parallelism. Ring attention over a simulated ring
# against whole-sequence attention (test_ring); the invariant for ring (none
# and zigzag) and Ulysses on cp = 2 and 4 and for dp x cp = 2 x 2; the cp
# traffic, the gradient all-reduce and the memory per rank against their
# formulas; bad meshes and flags; --help.
. "$(dirname "$0")/lib.sh"

echo "== chapter 6: context parallelism"
run_program "$BUILD/tests/test_ring"

# the invariant: chapter 0's losses, gradient norms and validation loss
invariant --norm --val "cp=2 ring" "$INV_FLAGS" 2 chapter-6 "--cp 2"
invariant --norm --val "cp=2 ring zigzag" "$INV_FLAGS" 2 chapter-6 "--cp 2 --cp-balance zigzag"
invariant --norm --val "cp=4 ring" "$INV_FLAGS" 4 chapter-6 "--cp 4"
invariant --norm --val "cp=4 ring zigzag" "$INV_FLAGS" 4 chapter-6 "--cp 4 --cp-balance zigzag"
RING4=$INV_LOG
invariant --norm --val "cp=2 ulysses" "$INV_FLAGS" 2 chapter-6 "--cp 2 --cp-mode ulysses"
ULY2=$INV_LOG
invariant --norm --val "cp=4 ulysses" "$INV_FLAGS" 4 chapter-6 "--cp 4 --cp-mode ulysses"
ULY4=$INV_LOG
invariant --norm --val "dp=2 x cp=2 ring zigzag" "$INV_FLAGS" 4 chapter-6 "--dp 2 --cp 2 --cp-balance zigzag"

# The formulas, on the tiny model (L = 2, C = 64, NH = 4, Vp = 256) with
# INV_FLAGS (B = 24, T = 32): N = B T / cp token rows per rank (dp = 1).
L=2 C=64 NH=4 VP=256 T=$INV_SEQ P=120576
# summary_has NAME LOG TEXT: the summary record of LOG contains TEXT
summary_has() {
    if grep '"type":"summary"' "$2" | grep -qF -- "$3"; then
        pass "$1"
    else
        fail "$1" "want $3; summary: $(grep '"type":"summary"' "$2" | cut -c1-400)"
    fi
}
# The ring per layer and step: K/V go cp-1 hops in forward and again in
# backward, dK/dV cp hops (the last one home): L(3cp-2) sends of N x 2C floats.
N=$((INV_BATCH * T / 4))
summary_has "cp=4 ring: L(3cp-2) = 20 sends of N 2C 4 = $((N * 2 * C * 4)) bytes per rank per step" "$RING4" \
    "\"cp_calls_per_step\":20,\"cp_bytes_per_step\":$((20 * N * 2 * C * 4))}"
# Ulysses per layer and step: all-to-alls of qkv (3C) and the output (C) in
# forward, of d output (C) and dqkv (3C) in backward: 4L calls, 8 L N C floats.
summary_has "cp=4 ulysses: 4L = 8 all-to-alls of 8 L N C 4 = $((8 * L * N * C * 4)) bytes per rank per step" "$ULY4" \
    "\"cp_calls_per_step\":8,\"cp_bytes_per_step\":$((8 * L * N * C * 4))}"
# the gradients: one all-reduce of all P parameters per step over dp x cp
summary_has "cp=4: one all-reduce of the $P gradients per step over the dp+cp group" "$RING4" \
    "\"allreduce\":{\"dp+cp\":{\"calls\":$(rank_array $INV_STEPS 4),\"bytes\":$(rank_array $((INV_STEPS * P * 4)) 4),"
# Memory per rank (floats x 4 bytes): a full replica, P each for params and
# grads, 2P for AdamW; activations per layer N(18C + 4) for the block plus
# ring N NH (lse) / Ulysses N(3C + NH T) (my heads' qkv and probabilities for
# whole sequences), and once N(21C + Vp + 8) (embedding, head, backward
# buffers, the ring's pair partials C + 3NH) / N(24C + Vp + 8 + NH T)
# (Ulysses' head buffers); comm: the ring's five N x 2C K/V buffers,
# Ulysses' send and receive N x 3C.
ring_act=$((4 * (L * N * (18 * C + 4 + NH) + N * (21 * C + VP + 8 + 3 * NH))))
summary_has "cp=4 ring memory per rank: params, grads, optimizer P, P, 2P; activations $ring_act; comm 5 N 2C" "$RING4" \
    "\"peak_bytes\":{\"params\":$(rank_array $((P * 4)) 4),\"grads\":$(rank_array $((P * 4)) 4),\"optimizer\":$(rank_array $((2 * P * 4)) 4),\"activations\":$(rank_array $ring_act 4),\"comm\":$(rank_array $((5 * N * 2 * C * 4)) 4),"
N=$((INV_BATCH * T / 2))
uly_act=$((4 * (L * N * (21 * C + 4 + NH * T) + N * (24 * C + VP + 8 + NH * T))))
summary_has "cp=2 ulysses memory per rank: activations $uly_act; comm 2 N 3C" "$ULY2" \
    "\"activations\":$(rank_array $uly_act 2),\"comm\":$(rank_array $((2 * N * 3 * C * 4)) 2),"
# zigzag's balance: the causal scores per rank, equal (T(T+1)/2 B NH L / cp)
summary_has "cp=4 zigzag: every rank computes $((T * (T + 1) / 2 * INV_BATCH * NH * L / 4)) attention scores per step" "$RING4" \
    "\"attention_scores_per_rank\":$(rank_array $((T * (T + 1) / 2 * INV_BATCH * NH * L / 4)) 4)"

# bad meshes and flags: one message, every rank exits
error_case chapter-6 3 "--cp 3" "--seq 64 does not split over cp=3"
error_case chapter-6 4 "--cp 4 --seq 12 --batch 4 --cp-balance zigzag" "--seq 12 does not split into 2 x cp = 8 zigzag half-chunks"
error_case chapter-6 3 "--cp 3 --seq 24 --batch 3 --cp-mode ulysses" "ulysses splits the model's 4 heads over cp=3"
error_case chapter-6 2 "--cp 2 --cp-mode star" "--cp-mode star is not one of ring, ulysses"
error_case chapter-6 2 "--cp 2 --cp-balance random" "--cp-balance random is not one of none, zigzag"
error_case chapter-6 2 "--tp 2" "--tp 2 without --sp"
error_case chapter-6 2 "--tp 2 --sp" "--sp (Megatron sequence parallelism) is not yet in this chapter"
error_case chapter-6 4 "--cp 2" "has 2 ranks but mpirun started 4"
error_case chapter-6 2 "--cp 2 --recompute full" "chapter 6 keeps its activations its own way"
help_case chapter-6 "--cp-balance"

finish
