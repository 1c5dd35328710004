# file: 03_fsdp/fsdp.c
# The reduce-scatter sums the gradient shards instead of averaging them.
/^void fsdp_reduce_grads/,/^}/s/COMM_AVG/COMM_SUM/
