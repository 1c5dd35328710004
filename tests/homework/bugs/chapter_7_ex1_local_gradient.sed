# file: 07_expert/moe_layer.c
# The gradient of the load-balancing loss per prob as for one rank's own
# tokens (/ N_global): forgets that it is averaged over dp x ep afterwards.
s|aux_host\[e\] = (float)(X->aux_coef \* E \* f / N);|aux_host[e] = (float)(X->aux_coef * E * f / n_global);|
