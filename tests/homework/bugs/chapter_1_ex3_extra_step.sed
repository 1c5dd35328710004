# file: 01_collectives/collectives.c
# The ring all-gather runs p steps, not p-1: the last one sends every rank
# its own block back, so the result is right but each rank receives a block
# more than the p-1 it lacks.
/EXERCISE 3: ring all-gather/,/END EXERCISE 3/s/for (int k = 0; k < p - 1; k++) {/for (int k = 0; k < p; k++) {/
