# file: 06_sequence_context/main.c
# The dK/dV that arrived is dropped instead of added: each block's gradient
# comes home with the last rank's share only.
/^static void ring_attention_backward/,/^}/{/ops_add(dkv, m->dkv_in, kv_count);/d}
