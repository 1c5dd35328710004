// ops_flash.c: causal self-attention in O(T) memory (the online softmax over key
// blocks), and the same kernel on sequence chunks with offsets (ring and zigzag
// attention), on the CPU (shapes and semantics: common/ops/attention.h).
#include "ops_cpu.h"

// ---------------------------------------------------------------- attention in O(T) memory
// FlashAttention's algorithm (Dao et al. 2022, "FlashAttention: Fast and
// Memory-Efficient Exact Attention with IO-Awareness", its backward's loop
// order too; the one log-sum-exp a row keeps for backward from Dao 2023,
// "FlashAttention-2"), on the online softmax of
// Milakov & Gimelshein 2018 ("Online normalizer calculation for softmax"):
// the scores of a tile of queries against one block of FLASH_BK keys live
// in a tile of the thread's own, are folded into each row's
// running (max m, sum l, unnormalised output o) and forgotten. Per row:
//   m' = max(m, max_j s_j),  l' = l e^(m - m') + sum_j e^(s_j - m'),
//   o' = o e^(m - m') + sum_j e^(s_j - m') v_j,
// and after the last block out = o / l, lse = m + log l. That is
// attention_chunk_merge's identity with a block of keys for a chunk: the
// ring of chapter 6 is this loop with the blocks on other ranks.
// Backward recomputes each tile's probabilities p = e^(s - lse) from q and k.
//
// Bits: every product runs through flash_mm (each element one chain over
// its sum's index, in order, no fused multiply-add), every row's sums and
// maxima run over the keys it sees, blocks at fixed key positions
// (multiples of FLASH_BK from the chunk's first key), and a row takes part
// in a block only if it sees a key of it. So a row's out and lse are a
// function of its query and the keys and values it sees, whatever B, the
// other rows, the tile it falls in and the thread count; dq likewise, and
// dk, dv of a key are one fixed chain over the queries that see it.

// How many keys of the chunk query i sees: keys 0 .. q0 + i - k0, within 0..Tk.
static inline int chunk_keys_visible(int i, int q0, int k0, int Tk) {
    int n = q0 + i - k0 + 1;
    return n < 0 ? 0 : (n > Tk ? Tk : n);
}

#define FLASH_BQ 64  // query rows per tile (backward)
#define FLASH_BK 64  // keys per block
// Forward's tiles are taller: a tile transposes each block of keys it
// meets once, so twice the rows halve those copies (2.5% of forward +
// backward at the small preset's T = 256, measured). Its scores, 128 x 64
// floats, and the block, 64 x hs, still fit the L2 cache.
#define FLASH_BQ_FWD 128

// The products of the attention tiles: out (R, J) = a (R, K) @ b (K, J),
// written or added into out, each element one chain over k in order, a
// multiply then an add, as rows_times_matrix. Its own register tile, sized
// for the attention's shapes (J = 64 keys or hs, K = hs or up to 64 keys,
// R = a group of FLASH_SUB = 16 rows or keys): FL_MR rows by FL_NR columns
// of accumulators that stay in registers. 8 rows divide a group, and a
// vector of b that 8 rows multiply stays in a register: with AVX2's 4 rows
// by 2 vectors, gcc read b again from memory for every row (12 loads a k
// instead of 6) and the flash op took 1.43 of full attention's CPU time
// where 8 by 1 takes 1.215 (medians, docs/attention.md). Rows past the
// last full tile and columns past the last full vector take narrower paths
// that add the same products in the same order, so an element's bits never
// depend on where its row or column falls: the tile's shape moves no bit.
#if defined(__AVX512F__)
#define FL_W 16   // 32 registers of 16 floats: 8 sums, 1 of b, 1 broadcast
#define FL_MR 8
#define FL_NR 16
#elif defined(__AVX__)
#define FL_W 8    // 16 registers of 8 floats: 8 sums, 1 of b, 1 broadcast
#define FL_MR 8
#define FL_NR 8
#else
#define FL_W 8    // 16 registers of 4 floats, a vector of 8 in two: 8 sums, 2 of b, 1 broadcast
#define FL_MR 4
#define FL_NR 8
#endif
#define FL_NV (FL_NR / FL_W)
typedef float FlVec __attribute__((vector_size(FL_W * sizeof(float))));
typedef float FlVecLoad __attribute__((vector_size(FL_W * sizeof(float)), aligned(4), may_alias));

static inline void flash_mm_tile(float* out, int ldo, const float* a, int ars, int aks, const float* b,
                                 int ldb, int K, int accumulate) {
    FlVec acc[FL_MR][FL_NV];
    for (int r = 0; r < FL_MR; r++)
        for (int v = 0; v < FL_NV; v++) acc[r][v] = (FlVec){0};
    for (int k = 0; k < K; k++) {
        const FlVecLoad* bk = (const FlVecLoad*)(b + (size_t)k * ldb);
        FlVec bv[FL_NV];
        for (int v = 0; v < FL_NV; v++) bv[v] = bk[v];
        for (int r = 0; r < FL_MR; r++) {
            float x = a[(size_t)r * ars + (size_t)k * aks];
            for (int v = 0; v < FL_NV; v++) acc[r][v] += x * bv[v];
        }
    }
    for (int r = 0; r < FL_MR; r++) {
        FlVecLoad* o = (FlVecLoad*)(out + (size_t)r * ldo);
        for (int v = 0; v < FL_NV; v++) {
            if (accumulate) o[v] += acc[r][v];
            else o[v] = acc[r][v];
        }
    }
}

// one row, columns [0, nr) with nr <= FL_NR: whole vectors, then single columns
static inline void flash_mm_row(float* out, const float* a, int aks, const float* b, int ldb, int nr,
                                int K, int accumulate) {
    int nv = nr / FL_W;
    FlVec acc[FL_NV];
    float tail[FL_W] = {0};
    for (int v = 0; v < FL_NV; v++) acc[v] = (FlVec){0};
    for (int k = 0; k < K; k++) {
        const float* bk = b + (size_t)k * ldb;
        float x = a[(size_t)k * aks];
        for (int v = 0; v < nv; v++) acc[v] += x * ((const FlVecLoad*)bk)[v];
        for (int j = nv * FL_W; j < nr; j++) tail[j - nv * FL_W] += x * bk[j];
    }
    for (int j = 0; j < nr; j++) {
        float s = j < nv * FL_W ? acc[j / FL_W][j % FL_W] : tail[j - nv * FL_W];
        out[j] = accumulate ? out[j] + s : s;
    }
}

// a (R, K) is read as a[r * ars + k * aks]: a row-major matrix with row
// stride lda is (ars, aks) = (lda, 1), and the transpose of a (K, R) one,
// without copying it, (1, lda).
static void flash_mm(float* out, int ldo, const float* a, int ars, int aks, const float* b, int ldb,
                     int R, int K, int J, int accumulate) {
    int R4 = R - R % FL_MR, J4 = J - J % FL_NR;
    for (int r0 = 0; r0 < R4; r0 += FL_MR)
        for (int j0 = 0; j0 < J4; j0 += FL_NR)
            flash_mm_tile(out + (size_t)r0 * ldo + j0, ldo, a + (size_t)r0 * ars, ars, aks, b + j0, ldb,
                          K, accumulate);
    for (int r = 0; r < R; r++) {
        if (r < R4 && J4 == J) continue;
        for (int j0 = r < R4 ? J4 : 0; j0 < J; j0 += FL_NR) {
            int nr = J - j0 < FL_NR ? J - j0 : FL_NR;
            flash_mm_row(out + (size_t)r * ldo + j0, a + (size_t)r * ars, aks, b + j0, ldb, nr, K,
                         accumulate);
        }
    }
}


// dst (cols, rows) = src (rows, cols)^T; src rows every src_stride floats,
// dst rows every dst_stride.
static void transpose_block(float* dst, int dst_stride, const float* src, int src_stride, int rows,
                            int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(size_t)c * dst_stride + r] = src[(size_t)r * src_stride + c];
}

// A tile's rows go through a block of keys in groups of FLASH_SUB, at fixed
// positions (i0, i0 + FLASH_SUB, ...): a group meets only the keys of the
// block its last row sees, rounded up to whole vectors (the rest would be
// masked anyway), so a block on the causal diagonal costs about 5/8 of a
// full one. Where a row's group ends depends on the row's position alone
// (and on i1, the end of the rows), and the keys a group leaves out are
// zeros at the end of each sum it would have entered, so a row's bits are
// the same whichever group it falls in.
#define FLASH_SUB 16
static inline int flash_group_end(int ra, int i0, int i1) {
    int rb = i0 + ((ra - i0) / FLASH_SUB + 1) * FLASH_SUB;
    return rb < i1 ? rb : i1;
}
// the keys of block j0 (nb of them) the rows before rb see, in whole vectors
static inline int flash_group_keys(int rb, int j0, int nb, int q0, int k0, int Tk) {
    int nc = chunk_keys_visible(rb - 1, q0, k0, Tk) - j0;
    nc = (nc + FL_NR - 1) / FL_NR * FL_NR;
    return nc < nb ? nc : nb;
}

// The forward of query rows i0..i1-1 of one (batch, head) against keys
// 0..Tk-1 of one kv chunk (positions as in attention_chunk_forward): o rows
// (one every o_stride floats) get the unnormalised sum, m and l (i1-i0) the
// row's max and sum of exponentials, as attention_chunk_forward defines
// them (-INFINITY, 0 and a zero row for a query that sees no key).
// Scratch: s (i1 - i0, FLASH_BK), kt (hs, FLASH_BK).
static void flash_forward_tile(float* o, int o_stride, float* m, float* l, const float* q,
                               int q_stride, const float* k, const float* v, int kv_stride, int i0,
                               int i1, int Tk, int q0, int k0, int hs, float scale, float* s,
                               float* kt) {
    for (int i = i0; i < i1; i++) {
        m[i - i0] = -INFINITY;
        l[i - i0] = 0.0f;
        for (int c = 0; c < hs; c++) o[(size_t)i * o_stride + c] = 0.0f;
    }
    const int nk = chunk_keys_visible(i1 - 1, q0, k0, Tk);  // the last row sees the most keys
    for (int j0 = 0; j0 < nk; j0 += FLASH_BK) {
        const int nb = nk - j0 < FLASH_BK ? nk - j0 : FLASH_BK;
        // the rows that see key j0, and so this block: i >= j0 + k0 - q0
        const int ia = j0 + k0 - q0 > i0 ? j0 + k0 - q0 : i0;
        transpose_block(kt, FLASH_BK, k + (size_t)j0 * kv_stride, kv_stride, nb, hs);
        for (int ra = ia, rb; ra < i1; ra = rb) {
            rb = flash_group_end(ra, i0, i1);
            const int nc = flash_group_keys(rb, j0, nb, q0, k0, Tk);
            float* sg = s + (size_t)(ra - ia) * FLASH_BK;
            // s (rb-ra, nc) = q[ra:rb] k[j0:j0+nc]^T, scaled below
            flash_mm(sg, FLASH_BK, q + (size_t)ra * q_stride, q_stride, 1, kt, FLASH_BK, rb - ra, hs, nc, 0);
            for (int i = ra; i < rb; i++) {
                float* row = sg + (size_t)(i - ra) * FLASH_BK;
                int nvis = chunk_keys_visible(i, q0, k0, Tk) - j0;
                if (nvis > nc) nvis = nc;
                float mx = -INFINITY;
                // a max is exact in any order, so it may run in lanes
                #pragma omp simd reduction(max : mx)
                for (int j = 0; j < nvis; j++) {
                    row[j] *= scale;
                    mx = row[j] > mx ? row[j] : mx;
                }
                float m_old = m[i - i0];
                float m_new = m_old > mx ? m_old : mx;
                float sum = exp_and_sum(row, nvis, m_new);
                for (int j = nvis; j < nc; j++) row[j] = 0.0f;  // future keys weigh 0 below
                // the rescale of what the earlier blocks gave (none: alpha 0)
                float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                l[i - i0] = l[i - i0] * alpha + sum;
                m[i - i0] = m_new;
                if (alpha != 1.0f) {
                    float* oi = o + (size_t)i * o_stride;
                    for (int c = 0; c < hs; c++) oi[c] *= alpha;
                }
            }
            // o[ra:rb] += p (rb-ra, nc) @ v[j0:j0+nc]
            flash_mm(o + (size_t)ra * o_stride, o_stride, sg, FLASH_BK, 1, v + (size_t)j0 * kv_stride,
                     kv_stride, rb - ra, nc, hs, 1);
        }
    }
}

void attention_flash_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    progress();
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int ld = 3 * C;
    #pragma omp parallel
    {
        // a tile of scores and a block of keys, transposed: 48 KiB at hs 64
        float* s = xmalloc(((size_t)FLASH_BQ_FWD * FLASH_BK + (size_t)hs * FLASH_BK) * sizeof(float));
        float* kt = s + (size_t)FLASH_BQ_FWD * FLASH_BK;
        float m[FLASH_BQ_FWD], l[FLASH_BQ_FWD];
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* q = qkv + (size_t)b * T * ld + h * hs;
                float* o = out + (size_t)b * T * C + h * hs;  // (T, hs), row stride C
                float* lse_bh = lse + (size_t)b * T * NH + h;  // row i at lse_bh[i * NH]
                for (int i0 = 0; i0 < T; i0 += FLASH_BQ_FWD) {
                    int i1 = i0 + FLASH_BQ_FWD < T ? i0 + FLASH_BQ_FWD : T;
                    flash_forward_tile(o, C, m, l, q, ld, q + C, q + 2 * C, ld, i0, i1, T, 0, 0, hs,
                                       scale, s, kt);
                    // every row sees key 0, so l >= 1 (its max term is e^0)
                    for (int i = i0; i < i1; i++) {
                        float inv = 1.0f / l[i - i0];
                        float* oi = o + (size_t)i * C;
                        for (int c = 0; c < hs; c++) oi[c] *= inv;
                        lse_bh[(size_t)i * NH] = m[i - i0] + logf(l[i - i0]);
                    }
                }
            }
        }
        free(s);
    }
    optime_stop(OPK_ATTENTION, OP_FWD, t0);
}

// The backward of one (batch, head) over query rows 0..Tq-1 and keys
// 0..Tk-1 of a kv chunk (positions as in attention_chunk_backward), in
// FlashAttention's order (both versions'): each block of keys meets every tile of queries
// that sees it, so dk and dv of the block build up in dk_acc, dv_acc and
// are added once; dq is added to block by block. dout and out rows every
// o_stride floats, lse every lse_stride.
typedef struct {
    float *kt, *vt;       // (hs, FLASH_BK): the block's keys and values, transposed
    float *p, *ds;        // (FLASH_BQ, FLASH_BK): probabilities, their score gradients
    float *dk_acc, *dv_acc;  // (FLASH_BK, hs)
} FlashBackScratch;

static float* flash_back_scratch(FlashBackScratch* w, int hs) {
    size_t kv = (size_t)hs * FLASH_BK, tile = (size_t)FLASH_BQ * FLASH_BK;
    float* base = xmalloc((4 * kv + 2 * tile) * sizeof(float));
    w->kt = base, w->vt = w->kt + kv, w->dk_acc = w->vt + kv, w->dv_acc = w->dk_acc + kv;
    w->p = w->dv_acc + kv, w->ds = w->p + tile;
    return base;
}

static void flash_backward_head(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, int o_stride, const float* lse, int lse_stride,
                                const float* q, int q_stride, const float* k, const float* v,
                                int kv_stride, int Tq, int Tk, int q0, int k0, int hs, float scale,
                                const FlashBackScratch* w) {
    for (int j0 = 0; j0 < Tk; j0 += FLASH_BK) {
        // the first query that sees key j0; none: no later block is seen either
        const int first = j0 + k0 - q0 > 0 ? j0 + k0 - q0 : 0;
        if (first >= Tq) break;
        const int nb = Tk - j0 < FLASH_BK ? Tk - j0 : FLASH_BK;
        transpose_block(w->kt, FLASH_BK, k + (size_t)j0 * kv_stride, kv_stride, nb, hs);
        transpose_block(w->vt, FLASH_BK, v + (size_t)j0 * kv_stride, kv_stride, nb, hs);
        memset(w->dk_acc, 0, (size_t)nb * hs * sizeof(float));
        memset(w->dv_acc, 0, (size_t)nb * hs * sizeof(float));
        for (int i0 = first - first % FLASH_BQ; i0 < Tq; i0 += FLASH_BQ) {
            const int i1 = i0 + FLASH_BQ < Tq ? i0 + FLASH_BQ : Tq;
            const int ia = first > i0 ? first : i0;
            // the keys of the block the tile's last row sees
            int nbk = chunk_keys_visible(i1 - 1, q0, k0, Tk) - j0;
            if (nbk > nb) nbk = nb;
            for (int ra = ia, rb; ra < i1; ra = rb) {
                rb = flash_group_end(ra, i0, i1);
                const int nc = flash_group_keys(rb, j0, nb, q0, k0, Tk);
                float* pg = w->p + (size_t)(ra - ia) * FLASH_BK;
                float* dg = w->ds + (size_t)(ra - ia) * FLASH_BK;
                // p (rb-ra, nc) = q k^T, exponentiated below; ds = dout v^T
                flash_mm(pg, FLASH_BK, q + (size_t)ra * q_stride, q_stride, 1, w->kt, FLASH_BK, rb - ra,
                         hs, nc, 0);
                flash_mm(dg, FLASH_BK, dout + (size_t)ra * o_stride, o_stride, 1, w->vt, FLASH_BK,
                         rb - ra, hs, nc, 0);
                for (int i = ra; i < rb; i++) {
                    float* prow = pg + (size_t)(i - ra) * FLASH_BK;
                    float* drow = dg + (size_t)(i - ra) * FLASH_BK;
                    int nvis = chunk_keys_visible(i, q0, k0, Tk) - j0;
                    if (nvis > nc) nvis = nc;
                    // D_i = dout_i . out_i = sum over ALL keys of p_ij (dout_i . v_j),
                    // the softmax's coupling term, from the finished out alone
                    const float D =
                        dot_lanes(dout + (size_t)i * o_stride, out + (size_t)i * o_stride, hs);
                    const float L = lse[(size_t)i * lse_stride];
                    #pragma omp simd
                    for (int j = 0; j < nvis; j++) {
                        prow[j] = exp_lanes(prow[j] * scale - L);
                        // the score's gradient, with the score's scale folded in
                        drow[j] = prow[j] * (drow[j] - D) * scale;
                    }
                    // future keys: zeros as far as the dq, dk and dv products
                    // below read
                    for (int j = nvis; j < (nc > nbk ? nc : nbk); j++) prow[j] = drow[j] = 0.0f;
                }
                // dq[ra:rb] += ds (rb-ra, nc) @ k[j0:j0+nc]
                flash_mm(dq + (size_t)ra * q_stride, q_stride, dg, FLASH_BK, 1,
                         k + (size_t)j0 * kv_stride, kv_stride, rb - ra, nc, hs, 1);
            }
            // dk_acc += ds^T @ q, dv_acc += p^T @ dout, by groups of FLASH_SUB
            // keys, each over the queries from the first that sees its first key
            for (int ka = 0; ka < nbk; ka += FLASH_SUB) {
                const int kb = ka + FLASH_SUB < nbk ? ka + FLASH_SUB : nbk;
                const int qa = j0 + ka + k0 - q0 > ia ? j0 + ka + k0 - q0 : ia;
                const float* dsg = w->ds + (size_t)(qa - ia) * FLASH_BK + ka;
                const float* pg = w->p + (size_t)(qa - ia) * FLASH_BK + ka;
                flash_mm(w->dk_acc + (size_t)ka * hs, hs, dsg, 1, FLASH_BK, q + (size_t)qa * q_stride,
                         q_stride, kb - ka, i1 - qa, hs, 1);
                flash_mm(w->dv_acc + (size_t)ka * hs, hs, pg, 1, FLASH_BK, dout + (size_t)qa * o_stride,
                         o_stride, kb - ka, i1 - qa, hs, 1);
            }
        }
        for (int j = 0; j < nb; j++) {
            float* dkj = dk + (size_t)(j0 + j) * kv_stride;
            float* dvj = dv + (size_t)(j0 + j) * kv_stride;
            for (int c = 0; c < hs; c++) {
                dkj[c] += w->dk_acc[(size_t)j * hs + c];
                dvj[c] += w->dv_acc[(size_t)j * hs + c];
            }
        }
    }
}

void attention_flash_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH) {
    progress();
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int ld = 3 * C;
    #pragma omp parallel
    {
        FlashBackScratch w;
        float* base = flash_back_scratch(&w, hs);
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                size_t off = (size_t)b * T * ld + h * hs;
                const float* q = qkv + off;
                float* dq = dqkv + off;
                size_t ooff = (size_t)b * T * C + h * hs;
                flash_backward_head(dq, dq + C, dq + 2 * C, dout + ooff, out + ooff, C,
                                    lse + (size_t)b * T * NH + h, NH, q, ld, q + C, q + 2 * C, ld, T,
                                    T, 0, 0, hs, scale, &w);
            }
        }
        free(base);
    }
    optime_stop(OPK_ATTENTION, OP_BWD, t0);
}

// ---------------------------------------------------------------- attention on sequence chunks
// A (query chunk, kv chunk) pair is a rectangle of the score matrix, cut by the
// causal diagonal where the two chunks overlap in position: the keys a query
// sees are a prefix of the kv chunk, growing with the query. That is the
// memory-efficient attention's loop above with the chunk's positions (q0,
// k0): the same tiles of queries, the same blocks of keys (from the kv
// chunk's first key), the same online softmax. A ring of chapter 6 is one
// more level of the same recurrence: a kv chunk is a block of keys that
// lives on another rank, folded in by attention_chunk_merge. As above, one
// (batch, head) pair per thread: it owns that head's slice of every row it
// writes, queries and keys alike, so nothing races; its tiles, 64 or 128
// by 64 floats, are its own, plain host memory (not an activation, not
// counted by the tracking allocator, memory.h).

void attention_chunk_forward(float* out, float* rowmax, float* sumexp, const float* q_all,
                             int q_stride, const float* k_all, const float* v_all, int kv_stride,
                             int B, int Tq, int Tk, int q0, int k0, int C, int NH) {
    progress();  // a ring's K/V block moves while this runs (chapter 6)
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* s = xmalloc(((size_t)FLASH_BQ_FWD * FLASH_BK + (size_t)hs * FLASH_BK) * sizeof(float));
        float* kt = s + (size_t)FLASH_BQ_FWD * FLASH_BK;
        float m[FLASH_BQ_FWD], l[FLASH_BQ_FWD];
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* q = q_all + (size_t)b * Tq * q_stride + h * hs;
                const size_t kv = (size_t)b * Tk * kv_stride + h * hs;
                float* o = out + (size_t)b * Tq * C + h * hs;  // (Tq, hs), row stride C
                const size_t r0 = (size_t)b * Tq * NH + h;     // stats row of query i: r0 + i*NH
                for (int i0 = 0; i0 < Tq; i0 += FLASH_BQ_FWD) {
                    int i1 = i0 + FLASH_BQ_FWD < Tq ? i0 + FLASH_BQ_FWD : Tq;
                    // the partials, not normalised: what attention_flash_forward
                    // finishes at once, the ring merges with the other chunks' first
                    flash_forward_tile(o, C, m, l, q, q_stride, k_all + kv, v_all + kv, kv_stride, i0, i1,
                                       Tk, q0, k0, hs, scale, s, kt);
                    for (int i = i0; i < i1; i++) {
                        rowmax[r0 + (size_t)i * NH] = m[i - i0];
                        sumexp[r0 + (size_t)i * NH] = l[i - i0];
                    }
                }
            }
        }
        free(s);
    }
    optime_stop(OPK_ATTENTION, OP_FWD, t0);
}

// Stats (B, Tq, NH) and out (B, Tq, C) = (B*Tq*NH, hs) list the (token, head)
// rows in the same order, so row r of the stats owns out[r*hs .. r*hs + hs).
void attention_chunk_merge(float* out, float* rowmax, float* sumexp, const float* out2,
                           const float* rowmax2, const float* sumexp2, int B, int Tq, int C,
                           int NH) {
    double t0 = optime_start();
    const int hs = C / NH;
    const size_t rows = (size_t)B * Tq * NH;
    #pragma omp parallel for
    for (size_t r = 0; r < rows; r++) {
        float m = rowmax[r] > rowmax2[r] ? rowmax[r] : rowmax2[r];
        // an empty side (sumexp 0, rowmax -inf) weighs 0: exp(-inf - m) would be
        // NaN when the other side is empty too
        float a1 = sumexp[r] > 0.0f ? expf(rowmax[r] - m) : 0.0f;
        float a2 = sumexp2[r] > 0.0f ? expf(rowmax2[r] - m) : 0.0f;
        float* o = out + r * hs;
        const float* o2 = out2 + r * hs;
        for (int c = 0; c < hs; c++) o[c] = o[c] * a1 + o2[c] * a2;
        sumexp[r] = sumexp[r] * a1 + sumexp2[r] * a2;
        rowmax[r] = m;
    }
    optime_stop(OPK_ATTENTION, OP_FWD, t0);
}

void attention_chunk_finish(float* out, float* lse, const float* rowmax, const float* sumexp,
                            int B, int Tq, int C, int NH) {
    double t0 = optime_start();
    const int hs = C / NH;
    const size_t rows = (size_t)B * Tq * NH;
    #pragma omp parallel for
    for (size_t r = 0; r < rows; r++) {
        float l = sumexp[r];
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float* o = out + r * hs;
        for (int c = 0; c < hs; c++) o[c] *= inv;
        lse[r] = l > 0.0f ? rowmax[r] + logf(l) : -INFINITY;  // rowmax read first: lse may be rowmax
    }
    optime_stop(OPK_ATTENTION, OP_FWD, t0);
}

// Backward: flash_backward_head on the pair, the same loop as
// attention_flash_backward's with the chunks' positions.
void attention_chunk_backward(float* dq_all, float* dk_all, float* dv_all, const float* dout,
                              const float* out, const float* lse, const float* q_all, int q_stride,
                              const float* k_all, const float* v_all, int kv_stride, int B, int Tq,
                              int Tk, int q0, int k0, int C, int NH) {
    progress();
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        FlashBackScratch w;
        float* base = flash_back_scratch(&w, hs);
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const size_t qo = (size_t)b * Tq * q_stride + h * hs;
                const size_t kv = (size_t)b * Tk * kv_stride + h * hs;
                const size_t oo = (size_t)b * Tq * C + h * hs;  // dout, out: (Tq, hs), row stride C
                flash_backward_head(dq_all + qo, dk_all + kv, dv_all + kv, dout + oo, out + oo, C,
                                    lse + (size_t)b * Tq * NH + h, NH, q_all + qo, q_stride, k_all + kv,
                                    v_all + kv, kv_stride, Tq, Tk, q0, k0, hs, scale, &w);
            }
        }
        free(base);
    }
    optime_stop(OPK_ATTENTION, OP_BWD, t0);
}
