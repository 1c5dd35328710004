// ops_attention.c: causal self-attention that stores its (T, T) scores: the reference
// the tests and build/attention_bench hold the O(T) op to, on the CPU (shapes and
// semantics: common/ops/attention.h).
#include "ops_cpu.h"

// ---------------------------------------------------------------- attention
// Rows of the score matrix per causal block (see attention_forward).
#define ATT_ROW_BLOCK 64

// One (batch, head) pair is a (T, hs) slice of q, k and v with row stride 3C,
// so each pair is a few small matmuls; pairs run in parallel, one per thread.

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    progress();
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int ld = 3 * C;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float* q = qkv + (size_t)b * T * ld + h * hs;
            const float* k = q + C;
            const float* v = q + 2 * C;
            float* a = att + ((size_t)b * NH + h) * T * T;     // (T, T)
            float* o = out + (size_t)b * T * C + h * hs;       // (T, hs), row stride C
            // Causal blocks: rows i0..i1-1 see keys 0..i1-1 at most, so each
            // block of rows multiplies only that many keys; the masked
            // upper-right blocks (nearly half of a full T x T) are never
            // computed. Every score is the same dot of hs terms as in a full
            // product, and att @ v only leaves out terms that are exact zeros.
            for (int i0 = 0; i0 < T; i0 += ATT_ROW_BLOCK) {
                int i1 = i0 + ATT_ROW_BLOCK < T ? i0 + ATT_ROW_BLOCK : T;
                float* ab = a + (size_t)i0 * T;
                // scores (i1-i0, i1) = q[i0:i1] k[0:i1]^T * scale
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, hs,
                            scale, q + (size_t)i0 * ld, ld, k, ld, 0.0f, ab, T);
                // causal softmax: row t sees keys 0..t; future keys get probability 0
                for (int t = i0; t < i1; t++) {
                    float* row = a + (size_t)t * T;
                    float mx = row[0];
                    // a max is exact in any order, so it may run in lanes
                    #pragma omp simd reduction(max : mx)
                    for (int s = 1; s <= t; s++) mx = row[s] > mx ? row[s] : mx;
                    float sum = exp_and_sum(row, t + 1, mx);
                    float inv = 1.0f / sum;
                    for (int s = 0; s <= t; s++) row[s] *= inv;
                    // att @ v below reads this block's columns up to i1, so
                    // the future keys inside them must be zeros; the columns
                    // past i1 are never read (by backward either), and are
                    // left as they are (ops.h: only the causal part is defined)
                    for (int s = t + 1; s < i1; s++) row[s] = 0.0f;
                }
                // out[i0:i1] (i1-i0, hs) = att[i0:i1, 0:i1] @ v[0:i1]
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1,
                            1.0f, ab, T, v, ld, 0.0f, o + (size_t)i0 * C, C);
            }
        }
    }
    optime_stop(OPK_ATTENTION, OP_FWD, t0);
}

void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
    progress();
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int ld = 3 * C;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t off = (size_t)b * T * ld + h * hs;
            const float* q = qkv + off;
            const float* k = q + C;
            const float* v = q + 2 * C;
            float* dq = dqkv + off;
            float* dk = dq + C;
            float* dv = dq + 2 * C;
            const float* a = att + ((size_t)b * NH + h) * T * T;
            float* da = datt + ((size_t)b * NH + h) * T * T;
            const float* d = dout + (size_t)b * T * C + h * hs;
            // The causal blocks of attention_forward again. A block of query
            // rows i0..i1-1 meets keys 0..i1-1; a block of key columns
            // j0..j1-1 is met by queries j0..T-1. Each product leaves out only
            // terms that are exact zeros, in the order the full product adds.
            for (int i0 = 0; i0 < T; i0 += ATT_ROW_BLOCK) {
                int i1 = i0 + ATT_ROW_BLOCK < T ? i0 + ATT_ROW_BLOCK : T;
                // datt[i0:i1, 0:i1] = dout[i0:i1] @ v[0:i1]^T
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, hs,
                            1.0f, d + (size_t)i0 * C, C, v, ld, 0.0f, da + (size_t)i0 * T, T);
                // softmax backward, in place: dscore = att * (datt - sum(att * datt))
                for (int t = i0; t < i1; t++) {
                    const float* arow = a + (size_t)t * T;
                    float* drow = da + (size_t)t * T;
                    float dot = dot_lanes(arow, drow, t + 1);
                    for (int s = 0; s <= t; s++) drow[s] = arow[s] * (drow[s] - dot);
                    // zeros up to the block's edge i1, which the dk product
                    // below reads; it never reads past it
                    for (int s = t + 1; s < i1; s++) drow[s] = 0.0f;
                }
                // dq[i0:i1] += dscore[i0:i1, 0:i1] @ k[0:i1] * scale
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1,
                            scale, da + (size_t)i0 * T, T, k, ld, 1.0f, dq + (size_t)i0 * ld, ld);
            }
            // by key columns, now that every row of dscore is done
            for (int j0 = 0; j0 < T; j0 += ATT_ROW_BLOCK) {
                int j1 = j0 + ATT_ROW_BLOCK < T ? j0 + ATT_ROW_BLOCK : T;
                const float* ab = a + (size_t)j0 * T + j0;   // att[j0:T, j0:j1]
                const float* db = da + (size_t)j0 * T + j0;  // dscore[j0:T, j0:j1]
                // dv[j0:j1] += att[j0:T, j0:j1]^T @ dout[j0:T]
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, T - j0,
                            1.0f, ab, T, d + (size_t)j0 * C, C, 1.0f, dv + (size_t)j0 * ld, ld);
                // dk[j0:j1] += dscore[j0:T, j0:j1]^T @ q[j0:T] * scale
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, T - j0,
                            scale, db, T, q + (size_t)j0 * ld, ld, 1.0f, dk + (size_t)j0 * ld, ld);
            }
        }
    }
    optime_stop(OPK_ATTENTION, OP_BWD, t0);
}
