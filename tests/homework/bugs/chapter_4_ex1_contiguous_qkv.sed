# file: 04_fsdp_tp/tp.c
# qkvw cut as one contiguous row range [r 3C/tp, (r+1) 3C/tp) instead of
# three (the q, k and v rows of the rank's heads): on tp = 2 rank 0 gets every
# query and no values.
s|add_tile(s, P_QKVW, l, k \* C + r \* Cl, Cl, 0, C);|add_tile(s, P_QKVW, l, r * 3 * Cl + k * Cl, Cl, 0, C);|
s|add_tile(s, P_QKVB, l, k \* C + r \* Cl, Cl, 0, 1);|add_tile(s, P_QKVB, l, r * 3 * Cl + k * Cl, Cl, 0, 1);|
