# file: 01_collectives/collectives.c
# Recursive doubling swaps with virtual rank vrank^mask as if it were a real
# rank: right when p is a power of two, wrong peer otherwise.
# hangs: on 3 and 6 ranks a rank waits for a peer that swaps with another
s/int peer = vpeer < rem ? 2 \* vpeer + 1 : vpeer + rem;/int peer = vpeer;/
