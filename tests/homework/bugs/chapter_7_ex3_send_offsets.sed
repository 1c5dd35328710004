# file: 07_expert/moe_layer.c
# The receive displacements taken from the send side: the rows from each
# source land where my own rows to it start.
s|L->rc\[i\] = r_rows \* C, L->rd\[i\] = ro, ro += r_rows \* C;|L->rc[i] = r_rows * C, L->rd[i] = so - s_rows * C, ro += r_rows * C;|
