# file: 01_collectives/collectives.c
# The all-to-all stores the block from rank r-k at the slot of the rank it
# sent to (r+k): right on 2 ranks only.
s/recv + (size_t)src \* n, n, src);/recv + (size_t)dst * n, n, src);/
