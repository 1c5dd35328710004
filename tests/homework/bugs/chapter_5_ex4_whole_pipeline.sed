# file: 05_pipeline/main.c
# The tied embedding's two halves all-reduced over the whole pipeline group
# instead of the embedding group of the first and the last stage: the same
# group at pp 2, so only a mesh of 3 or more stages tells them apart.
s|comm_allreduce(&P->embed, mine, param_tensor_numel(P->cfg, P_WTE), COMM_SUM);|comm_allreduce(P->pp, mine, param_tensor_numel(P->cfg, P_WTE), COMM_SUM);|
