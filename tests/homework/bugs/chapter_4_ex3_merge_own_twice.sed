# file: 04_fsdp_tp/tp.c
# The merge starts at rank 0, whose partials are already the start: rank 0's
# slice of the vocabulary counts twice in the sum of exponentials.
s|for (int r = 1; r < m->ntp; r++) {|for (int r = 0; r < m->ntp; r++) {|
