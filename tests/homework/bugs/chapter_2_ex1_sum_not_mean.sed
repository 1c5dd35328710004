# file: 02_data_parallel/main.c
# Naive averaging sums the gradients instead of averaging them: the step sees
# dp times the gradient (clipping hides much of it in the loss, not in the norm).
/^static void average_naive/,/^}/s/COMM_AVG/COMM_SUM/
