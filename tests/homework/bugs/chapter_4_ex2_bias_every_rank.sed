# file: 04_fsdp_tp/main.c
# The row-parallel bias added by every tp rank: the all-reduce sums it tp
# times.
s|matmul_forward(a->attproj, a->atty, p->attprojw, m->rtp == 0 ? p->attprojb : NULL, N, Cl, C);|matmul_forward(a->attproj, a->atty, p->attprojw, p->attprojb, N, Cl, C);|
