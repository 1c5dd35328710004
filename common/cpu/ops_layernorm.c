// ops_layernorm.c: LayerNorm forward and backward, on the CPU (shapes and semantics:
// common/ops/layernorm.h).
#include "ops_cpu.h"

// ---------------------------------------------------------------- layernorm

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int N, int C) {
    double t0 = optime_start();
    const float eps = 1e-5f;
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        float var = 0.0f;
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= C;
        float s = 1.0f / sqrtf(var + eps);
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[n] = m;
        rstd[n] = s;
    }
    optime_stop(OPK_LAYERNORM, OP_FWD, t0);
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                        const float* inp, const float* w, const float* mean,
                        const float* rstd, int N, int C) {
    double t0 = optime_start();
    // dinp: rows are independent, parallel over rows.
    if (dinp) {
        #pragma omp parallel for
        for (int n = 0; n < N; n++) {
            const float* x = inp + (size_t)n * C;
            const float* d = dout + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            // the two means that the normalisation couples every channel through
            float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
            for (int c = 0; c < C; c++) {
                float norm = (x[c] - m) * s;
                float dnorm = w[c] * d[c];
                dnorm_mean += dnorm;
                dnorm_norm_mean += dnorm * norm;
            }
            dnorm_mean /= C;
            dnorm_norm_mean /= C;
            float* di = dinp + (size_t)n * C;
            for (int c = 0; c < C; c++) {
                float norm = (x[c] - m) * s;
                float dnorm = w[c] * d[c];
                di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
            }
        }
    }
    // dw, db: sums over rows, parallel over channels; skipped when neither is
    // wanted (the input half of a split backward), as on the GPU.
    if (!dw && !db) {
        optime_stop(OPK_LAYERNORM, OP_BWD, t0);
        return;
    }
    // A block of channels per thread, rows in order (as matmul_backward's
    // dbias): contiguous reads, and each channel's sums keep their order.
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += OPS_COL_BLOCK) {
        int nc = C - c0 < OPS_COL_BLOCK ? C - c0 : OPS_COL_BLOCK;
        float sw[OPS_COL_BLOCK] = {0}, sb[OPS_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float* x = inp + (size_t)n * C + c0;
            const float* d = dout + (size_t)n * C + c0;
            float m = mean[n], r = rstd[n];
            for (int c = 0; c < nc; c++) {
                float norm = (x[c] - m) * r;
                sw[c] += norm * d[c];
                sb[c] += d[c];
            }
        }
        for (int c = 0; c < nc; c++) {
            if (dw) dw[c0 + c] += sw[c];
            if (db) db[c0 + c] += sb[c];
        }
    }
    optime_stop(OPK_LAYERNORM, OP_BWD, t0);
}
