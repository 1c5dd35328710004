// ops_optimizer.c: AdamW and the gradient norm, on the CPU (shapes and semantics:
// common/ops/optimizer.h).
#include "ops_cpu.h"

// ---------------------------------------------------------------- optimizer

void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                  AdamWConfig cfg, int t, float grad_scale) {
    double t0 = optime_start();
    float bc1 = 1.0f - powf(cfg.beta1, (float)t);
    float bc2 = 1.0f - powf(cfg.beta2, (float)t);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = cfg.beta1 * m[i] + (1.0f - cfg.beta1) * g;
        float vi = cfg.beta2 * v[i] + (1.0f - cfg.beta2) * g * g;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        m[i] = mi;
        v[i] = vi;
        params[i] -= cfg.lr * (mhat / (sqrtf(vhat) + cfg.eps) + cfg.weight_decay * params[i]);
    }
    optime_stop(OPK_OPTIMIZER, OP_FWD, t0);
}

// The sum in a fixed order, whatever the thread count: blocks of
// SUMSQ_BLOCK values, each summed in order, then the blocks' sums in order.
// (An OpenMP reduction would add the threads' shares in whatever order they
// finish, split where the thread count says.)
#define SUMSQ_BLOCK 4096
void grad_sumsq(double* sumsq, const float* grads, size_t n) {
    double t0 = optime_start();
    size_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double* part = xmalloc((nb ? nb : 1) * sizeof(double));
    #pragma omp parallel for if (n > OPS_PARALLEL_MIN)
    for (size_t b = 0; b < nb; b++) {
        size_t i1 = (b + 1) * SUMSQ_BLOCK < n ? (b + 1) * SUMSQ_BLOCK : n;
        double s = 0.0;
        for (size_t i = b * SUMSQ_BLOCK; i < i1; i++) s += (double)grads[i] * grads[i];
        part[b] = s;
    }
    double s = 0.0;
    for (size_t b = 0; b < nb; b++) s += part[b];
    free(part);
    *sumsq += s;  // the slice's sum, then into the step's (as the CUDA twin adds)
    optime_stop(OPK_OPTIMIZER, OP_FWD, t0);
}

float grad_clip_scale(double norm, float clip) {
    if (clip <= 0.0f || norm <= clip) return 1.0f;
    return (float)(clip / norm);
}
