# file: 01_collectives/collectives.c
# The ring reduce-scatter runs p steps, not p-1: the extra step adds a
# partial sum into a chunk the rank does not keep, so chunk r is still right,
# but every rank receives one chunk more than the ring's (p-1)/p of n.
/EXERCISE 2: ring reduce-scatter/,/END EXERCISE 2/s/for (int k = 0; k < p - 1; k++) {/for (int k = 0; k < p; k++) {/
