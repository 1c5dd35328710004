# file: 01_collectives/collectives.c
# The all-gather forwards block r-1-k at step k, one it has not received yet.
s/int send_block = mod(r - k, p), recv_block = mod(r - 1 - k, p);/int send_block = mod(r - 1 - k, p), recv_block = mod(r - 1 - k, p);/
