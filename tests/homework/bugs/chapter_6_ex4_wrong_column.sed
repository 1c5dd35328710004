# file: 06_sequence_context/main.c
# The pack steps through q, k and v by C/cp instead of C: head group j gets
# the wrong columns.
/^static void seq_to_heads/,/^}/{s|src + t \* C + j \* c|src + t * c + j * c|}
