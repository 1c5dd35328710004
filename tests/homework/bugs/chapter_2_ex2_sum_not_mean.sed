# file: 02_data_parallel/main.c
# The parameter server reduces without averaging: rank 0 steps on the sum.
s/comm_reduce(dp->dp, m->grads, dp->ps_grads, m->num_params, 0, COMM_AVG);/comm_reduce(dp->dp, m->grads, dp->ps_grads, m->num_params, 0, COMM_SUM);/
