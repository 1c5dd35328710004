// train_step.c: what every step does across ranks, the same in every
// chapter: the AdamW settings, the loss's mean, the gradient's global norm
// (train_step.h).
#include "train_step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "memory.h"


AdamWConfig train_adamw(const TrainArgs* a) {
    AdamWConfig opt = {.lr = a->lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = a->wd};
    return opt;
}

double train_mean(const Comm* group, double mine) {
    double total = 0.0;
    MPI_CHECK(MPI_Allreduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, group->mpi));
    return total / group->size;
}

// The run's norm scalars, allocated once: the step's sum of squares (a
// double) and, behind it, the float the all-reduce carries; norm_host is
// their staging buffer on the host (memory.h), read every step.
static double* norm_buf = NULL;
static double* norm_host = NULL;

static double* norm_scalars(void) {
    if (!norm_buf) norm_buf = mem_alloc(2 * sizeof(double), MEM_OTHER);
    if (!norm_host) norm_host = mem_alloc_host(2 * sizeof(double));
    return norm_buf;
}

double* train_sumsq_begin(void) {
    mem_zero(norm_scalars(), sizeof(double));
    return norm_buf;
}

void train_sumsq_free(void) {
    mem_free(norm_buf);
    mem_free_host(norm_host);
    norm_buf = NULL;
    norm_host = NULL;
}

double train_global_norm(const double* sumsq, const Comm* const* groups, int n_groups) {
    if (n_groups == 0) {
        norm_scalars();
        mem_to_host(norm_host, sumsq, sizeof(double));
        return sqrt(norm_host[0]);
    }
    // the sum of squares travels as a float on the device, like any gradient
    // traffic, so the comm layer counts it (one all-reduce of 4 bytes per group)
    float* wire = (float*)(norm_scalars() + 1);
    ops_double_to_float(wire, sumsq, 1);
    for (int i = 0; i < n_groups; i++) comm_allreduce(groups[i], wire, 1, COMM_SUM);
    float* total = (float*)(norm_host + 1);
    mem_to_host(total, wire, sizeof(float));
    return sqrt((double)*total);
}
