// ops_embedding.c: the token and position embedding, whole and by vocabulary shard, on
// the CPU (shapes and semantics: common/ops/embedding.h).
#include "ops_cpu.h"

// ---------------------------------------------------------------- embedding

void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe,
                     int B, int T, int C) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < B * T; n++) {
        const float* wt = wte + (size_t)tokens[n] * C;
        const float* wp = wpe + (size_t)(n % T) * C;
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = wt[c] + wp[c];
    }
    optime_stop(OPK_ENCODER, OP_FWD, t0);
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens,
                      int B, int T, int C) {
    double t0 = optime_start();
    // Two rows of dout may add into the same row of dwte (a repeated token), so
    // the scatter runs over channels in parallel, never over tokens.
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int n = 0; n < B * T; n++) {
            float d = dout[(size_t)n * C + c];
            if (dwte) dwte[(size_t)tokens[n] * C + c] += d;
            if (dwpe) dwpe[(size_t)(n % T) * C + c] += d;
        }
    }
    optime_stop(OPK_ENCODER, OP_BWD, t0);
}

void encoder_forward_vocab(float* out, const int* tokens, const float* wte_shard,
                           const float* wpe, int B, int T, int C, int v0, int nrows) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < B * T; n++) {
        int row = tokens[n] - v0;
        const float* wt = row >= 0 && row < nrows ? wte_shard + (size_t)row * C : NULL;
        const float* wp = wpe ? wpe + (size_t)(n % T) * C : NULL;
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (wt ? wt[c] : 0.0f) + (wp ? wp[c] : 0.0f);
    }
    optime_stop(OPK_ENCODER, OP_FWD, t0);
}

void encoder_backward_vocab(float* dwte_shard, float* dwpe, const float* dout,
                            const int* tokens, int B, int T, int C, int v0, int nrows) {
    double t0 = optime_start();
    // as encoder_backward: parallel over channels, so a repeated token never races
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int n = 0; n < B * T; n++) {
            float d = dout[(size_t)n * C + c];
            int row = tokens[n] - v0;
            if (dwte_shard && row >= 0 && row < nrows) dwte_shard[(size_t)row * C + c] += d;
            if (dwpe) dwpe[(size_t)(n % T) * C + c] += d;
        }
    }
    optime_stop(OPK_ENCODER, OP_BWD, t0);
}
