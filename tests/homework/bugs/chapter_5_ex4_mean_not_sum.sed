# file: 05_pipeline/pipeline.c
# The two halves of wte's gradient averaged instead of summed: the lookup's
# and the head's contributions each count half.
s/comm_allreduce(embed, mine, n, COMM_SUM);/comm_allreduce(embed, mine, n, COMM_AVG);/
