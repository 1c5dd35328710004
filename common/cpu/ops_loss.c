// ops_loss.c: the softmax cross-entropy in two phases (partials, merge, loss,
// gradient), on the CPU (shapes and semantics: common/ops/loss.h).
#include "ops_cpu.h"

// ---------------------------------------------------------------- loss

void crossentropy_partials(float* rowmax, float* sumexp, float* tlogit, const float* logits,
                           const int* targets, int N, int width, int nvalid, int v0) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * width;
        float mx = -INFINITY;
        for (int j = 0; j < nvalid; j++) mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
        for (int j = 0; j < nvalid; j++) sum += expf(row[j] - mx);
        int local = targets[n] - v0;
        rowmax[n] = mx;
        sumexp[n] = sum;
        tlogit[n] = (local >= 0 && local < nvalid) ? row[local] : 0.0f;
    }
    optime_stop(OPK_CROSSENTROPY, OP_FWD, t0);
}

void crossentropy_merge(float* rowmax, float* sumexp, float* tlogit, const float* max2,
                        const float* sum2, const float* tlog2, int N) {
    double t0 = optime_start();
    for (int n = 0; n < N; n++) {
        // rescale both sums to the larger of the two maxima
        float m = rowmax[n] > max2[n] ? rowmax[n] : max2[n];
        float s = 0.0f;
        if (sumexp[n] > 0.0f) s += sumexp[n] * expf(rowmax[n] - m);
        if (sum2[n] > 0.0f) s += sum2[n] * expf(max2[n] - m);
        rowmax[n] = m;
        sumexp[n] = s;
        tlogit[n] += tlog2[n];
    }
    optime_stop(OPK_CROSSENTROPY, OP_FWD, t0);
}

void crossentropy_loss(float* losses, const float* rowmax, const float* sumexp,
                       const float* tlogit, int N) {
    double t0 = optime_start();
    for (int n = 0; n < N; n++) losses[n] = logf(sumexp[n]) + rowmax[n] - tlogit[n];
    optime_stop(OPK_CROSSENTROPY, OP_FWD, t0);
}

void crossentropy_backward(float* dlogits, const float* logits, const int* targets,
                           const float* rowmax, const float* sumexp, float dloss,
                           int N, int width, int nvalid, int v0) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * width;
        float* drow = dlogits + (size_t)n * width;
        float inv = 1.0f / sumexp[n];
        int local = targets[n] - v0;
        for (int j = 0; j < nvalid; j++) {
            float p = expf(row[j] - rowmax[n]) * inv;
            drow[j] = (p - (j == local ? 1.0f : 0.0f)) * dloss;
        }
        for (int j = nvalid; j < width; j++) drow[j] = 0.0f;
    }
    optime_stop(OPK_CROSSENTROPY, OP_BWD, t0);
}
