# file: 01_collectives/collectives.c
# The reduce-scatter adds the incoming partial sum into the chunk it just sent
# (r-1-k) instead of the one that arrives (r-2-k): off by one chunk.
s/recv_chunk = mod(r - 2 - k, p);/recv_chunk = mod(r - 1 - k, p);/
