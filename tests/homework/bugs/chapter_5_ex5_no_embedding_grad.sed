# file: 05_pipeline/main.c
# W forgets the embedding: stage 0's wte and wpe get no gradient from the
# lookup under a split backward (it is a weight gradient too).
/^    if (k == 0) encoder_backward(P->dwte, P->dwpe, sl->dres, sl->inputs, b, T, C);$/d
