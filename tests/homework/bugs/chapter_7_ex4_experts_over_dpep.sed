# file: 07_expert/main.c
# The experts' gradients summed over dp x cp x ep like the replicated ones:
# the ep ranks hold different experts, whose gradients get added together.
s|comm_allreduce(m->dp, m->dexperts, m->n_experts, COMM_SUM);|comm_allreduce(\&m->batch, m->dexperts, m->n_experts, COMM_SUM);|
