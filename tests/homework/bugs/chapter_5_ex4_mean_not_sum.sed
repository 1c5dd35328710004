# file: 05_pipeline/main.c
# The two halves of wte's gradient averaged instead of summed: the lookup's
# and the head's contributions each count half.
s/comm_allreduce(&P->embed, mine, param_tensor_numel(P->cfg, P_WTE), COMM_SUM);/comm_allreduce(\&P->embed, mine, param_tensor_numel(P->cfg, P_WTE), COMM_AVG);/
