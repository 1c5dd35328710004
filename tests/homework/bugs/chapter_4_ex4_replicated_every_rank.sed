# file: 04_fsdp_tp/tp.c
# Every tp rank counts the replicated tensors (LayerNorms, row-parallel
# biases, wpe, lnf): they enter the norm tp times.
s|if (tl->replicated && m->rtp != 0) continue;|if (tl->replicated \&\& m->rtp != 0 \&\& 0) continue;|
