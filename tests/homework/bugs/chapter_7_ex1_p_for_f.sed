# file: 07_expert/moe_layer.c
# The load-balancing gradient with the mean router probability P_e where the
# token fraction f_e belongs: wrong the same way on every mesh.
s|aux_host\[e\] = (float)(X->aux_coef \* E \* f / N);|aux_host[e] = (float)(X->aux_coef * E * P / N);|
