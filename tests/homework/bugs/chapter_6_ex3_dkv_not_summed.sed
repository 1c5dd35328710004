# file: 06_sequence_context/context.c
# The dK/dV that arrived is dropped instead of added: each block's gradient
# comes home with the last rank's share only.
/^void cp_ring_backward/,/^}/{/ops_add(dkv, a->dkv_in, kv_count);/d}
