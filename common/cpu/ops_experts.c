// ops_experts.c: the router and the token traffic of a mixture-of-experts layer, on the
// CPU (shapes and semantics: common/ops/experts.h).
#include "ops_cpu.h"

// ---------------------------------------------------------------- mixture of experts

void moe_router_forward(float* probs, int* idx, float* gates, const float* logits, int N, int E,
                        int k) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* l = logits + (size_t)n * E;
        float* p = probs + (size_t)n * E;
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) {
            p[e] = expf(l[e] - mx);
            sum += p[e];
        }
        for (int e = 0; e < E; e++) p[e] /= sum;
        // top-k by selection: a strict > keeps the lower index on a tie
        int* id = idx + (size_t)n * k;
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= id[i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            id[j] = best;
            s += p[best];
        }
        for (int j = 0; j < k; j++) gates[(size_t)n * k + j] = p[id[j]] / s;
    }
    optime_stop(OPK_MOE, OP_FWD, t0);
}

void moe_router_backward(float* dlogits, const float* dgates, const float* aux_dprobs,
                         const float* probs, const int* idx, const float* gates, int N, int E,
                         int k) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* p = probs + (size_t)n * E;
        const int* id = idx + (size_t)n * k;
        const float* g = gates + (size_t)n * k;
        const float* dg = dgates ? dgates + (size_t)n * k : NULL;
        float dp[MOE_MAX_EXPERTS];
        for (int e = 0; e < E; e++) dp[e] = aux_dprobs ? aux_dprobs[e] : 0.0f;
        if (dg) {
            // g_m = p_m / S: d g_m / d p_i = (delta_mi - g_m) / S for a chosen i
            float s = 0.0f, dot = 0.0f;
            for (int j = 0; j < k; j++) s += p[id[j]];
            for (int j = 0; j < k; j++) dot += dg[j] * g[j];
            for (int j = 0; j < k; j++) dp[id[j]] += (dg[j] - dot) / s;
        }
        // softmax: dlogit_e = p_e (dp_e - sum_i p_i dp_i)
        float pdp = 0.0f;
        for (int e = 0; e < E; e++) pdp += p[e] * dp[e];
        float* dl = dlogits + (size_t)n * E;
        for (int e = 0; e < E; e++) dl[e] += p[e] * (dp[e] - pdp);
    }
    optime_stop(OPK_MOE, OP_BWD, t0);
}

void moe_gather_forward(float* out, const float* inp, const int* src, int n, int C) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * C, inp + (size_t)src[i] * C, (size_t)C * sizeof(float));
    optime_stop(OPK_MOE, OP_FWD, t0);
}

void moe_gather_backward(float* dinp, const float* dout, const int* pos, int N, int k, int C) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float* d = dinp + (size_t)t * C;
        for (int j = 0; j < k; j++) {
            int r = pos[(size_t)t * k + j];
            if (r < 0) continue;
            const float* g = dout + (size_t)r * C;
            for (int c = 0; c < C; c++) d[c] += g[c];
        }
    }
    optime_stop(OPK_MOE, OP_BWD, t0);
}

void moe_combine_forward(float* out, const float* rows, const float* gates, const int* pos, int N,
                         int k, int C) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float* o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = pos[(size_t)t * k + j];
            if (r < 0) continue;
            float g = gates[(size_t)t * k + j];
            const float* x = rows + (size_t)r * C;
            for (int c = 0; c < C; c++) o[c] += g * x[c];
        }
    }
    optime_stop(OPK_MOE, OP_FWD, t0);
}

void moe_combine_backward(float* drows, float* dgates, const float* dout, const float* rows,
                          const float* gates, const int* pos, int N, int k, int C) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const float* d = dout + (size_t)t * C;
        for (int j = 0; j < k; j++) {
            int r = pos[(size_t)t * k + j];
            if (r < 0) continue;
            if (drows) {
                float g = gates[(size_t)t * k + j];
                float* dr = drows + (size_t)r * C;
                for (int c = 0; c < C; c++) dr[c] += g * d[c];
            }
            if (dgates) {
                const float* x = rows + (size_t)r * C;
                float dot = 0.0f;
                for (int c = 0; c < C; c++) dot += d[c] * x[c];
                dgates[(size_t)t * k + j] += dot;
            }
        }
    }
    optime_stop(OPK_MOE, OP_BWD, t0);
}
