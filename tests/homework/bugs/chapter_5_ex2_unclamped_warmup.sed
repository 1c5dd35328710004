# file: 05_pipeline/schedule.c
# 1F1B's warm-up of pp - r - 1 forwards without the clamp to m: right while
# m >= pp - 1, a forward of a microbatch that does not exist below it.
s/warmup = s->pp - r - 1 < m ? s->pp - r - 1 : m,/warmup = s->pp - r - 1,/
