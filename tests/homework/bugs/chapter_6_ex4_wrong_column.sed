# file: 06_sequence_context/context.c
# The pack steps through q, k and v by C/cp instead of C: head group j gets
# the wrong columns.
/^void cp_seq_to_heads/,/^}/{s|src + t \* C + j \* c|src + t * c + j * c|}
