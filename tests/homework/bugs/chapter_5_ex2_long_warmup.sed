# file: 05_pipeline/schedule.c
# A warm-up of pp - r forwards instead of pp - r - 1: still a valid list and
# the same model, but every stage holds one microbatch more than 1F1B needs.
s/warmup = s->pp - r - 1 < m ? s->pp - r - 1 : m,/warmup = s->pp - r < m ? s->pp - r : m,/
