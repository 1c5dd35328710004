// ops_twin.h: the index logic of some of the CUDA ops' kernels as plain
// functions of one thread's indices, compiled twice: by nvcc into the kernels
// (common/cuda/ops_*.cu) and by the C compiler into tests/test_cuda_twins.c, which calls
// them in loops over every thread of the grid on the CPU and checks the
// result against the CPU ops and straightforward references. No GPU runs
// here; this is how the kernels' logic is tested without one.
//   - the embedding backward: the rows sorted by (token, row), then one
//     thread per (run of a token, channel) adding that token's rows in row
//     order (the CPU op's order: the same bits);
//   - column sums (matmul's dbias, LayerNorm's dw and db): chunks of rows,
//     each chunk's sum a tree over lanes, then the chunks' sums in order;
//   - the MoE gate gradient: a warp per (token, slot), lane l summing
//     channels l, l + 32, ... in order, then a tree over the 32 lanes;
//   - attention in O(T) memory (attention_flash_* and the chunk ops of
//     context parallelism, one set of kernels for both): each kernel's
//     phases between two __syncthreads(), as functions of one thread.
// What is not here is the CUDA machinery around the logic: the sort (CUB's
// radix sort, whose output is fixed because the keys are distinct), the
// shared-memory and warp-shuffle trees (the test spells out their pairing).
// C-compatible: no C++ in this file.
#ifndef OPS_TWIN_H
#define OPS_TWIN_H

#include <math.h>
#include <stddef.h>

#ifdef __CUDACC__
#define TWIN_FN static __host__ __device__ inline
#else
#define TWIN_FN static inline
#endif

// ---------------------------------------------------------------- embedding backward
// Row n of a batch of N rows with token tok gets the key (tok << bits) | n,
// bits the fewest that hold N - 1: distinct keys, so any sort gives the same
// order, rows grouped by token and, within a token, in row order.
TWIN_FN int enc_row_bits(int N) {
    int b = 0;
    while (b < 31 && (1L << b) < (long)N) b++;
    return b;
}
TWIN_FN unsigned long long enc_key(int token, int n, int bits) {
    return ((unsigned long long)(unsigned)token << bits) | (unsigned long long)(unsigned)n;
}
TWIN_FN int enc_key_token(unsigned long long key, int bits) { return (int)(unsigned)(key >> bits); }
TWIN_FN int enc_key_row(unsigned long long key, int bits) {
    return (int)(key & ((1ULL << bits) - 1ULL));
}

// Thread (i, c), i < N, c < C. When sorted[i] starts the run of a token
// (i == 0 or sorted[i - 1] holds another token) and that token's row of
// the shard exists (v0 <= token < v0 + nrows), the thread adds channel c of
// the run's rows of dout, in row order, into that row of dwte. Every other
// thread does nothing. So each (row of dwte, channel) is one thread's, and
// its sum is dwte + dout[n1] + dout[n2] + ..., n1 < n2 < ...: the CPU op's.
TWIN_FN void enc_dwte_thread(float* dwte, const float* dout, const unsigned long long* sorted, int N,
                             int C, int bits, int v0, int nrows, int i, int c) {
    int tok = enc_key_token(sorted[i], bits);
    if (i > 0 && enc_key_token(sorted[i - 1], bits) == tok) return;
    long row = (long)tok - v0;
    if (row < 0 || row >= nrows) return;
    float acc = dwte[(size_t)row * C + c];
    for (int m = i; m < N && enc_key_token(sorted[m], bits) == tok; m++)
        acc += dout[(size_t)enc_key_row(sorted[m], bits) * C + c];
    dwte[(size_t)row * C + c] = acc;
}

// ---------------------------------------------------------------- column sums
// A sum over the N rows of a row-major (N, C) array, per column: the rows
// are cut into chunks of col_chunk_rows(N, C) rows (the last may be
// shorter), a block per (tile of COL_TILE columns, chunk) with COL_LANES row
// lanes; lane y of a chunk starting at row r0 sums rows r0 + y,
// r0 + y + COL_LANES, ... below the chunk's end, in order; the lanes of a
// column add up in a tree (half = COL_LANES/2, ..., 1: lane y += lane
// y + half); then the chunks' sums add up in chunk order, from 0, and the
// total is added into the gradient. One chunk (N <= COL_CHUNK_ROWS): one
// pass, no partials. The chunking is a function of N and C only, so a
// call's bits are too. At most COL_MAX_PARTIALS partial sums per output
// array (a static device buffer) and COL_MAX_CHUNKS chunks: more rows make
// longer chunks.
#define COL_TILE 32
#define COL_LANES 16
#define COL_THREADS (COL_TILE * COL_LANES)
#define COL_CHUNK_ROWS 256
#define COL_MAX_PARTIALS (1 << 19)
#define COL_MAX_CHUNKS 4096  // under the grid's y limit (65535)

TWIN_FN int col_chunks(int N, int C) {
    long chunks = ((long)N + COL_CHUNK_ROWS - 1) / COL_CHUNK_ROWS;
    long cap = C > 0 ? COL_MAX_PARTIALS / C : 1;
    if (chunks > cap) chunks = cap;
    if (chunks > COL_MAX_CHUNKS) chunks = COL_MAX_CHUNKS;
    return chunks < 1 ? 1 : (int)chunks;
}
TWIN_FN int col_chunk_rows(int N, int C) {
    int chunks = col_chunks(N, C);
    return (int)(((long)N + chunks - 1) / chunks);
}

// Lane y's sum of column c over chunk r: dbias's (the rows of dout).
TWIN_FN float col_lane_sum(const float* x, int N, int C, int c, int r, int y) {
    int rows = col_chunk_rows(N, C);
    long r1 = (long)(r + 1) * rows < N ? (long)(r + 1) * rows : N;
    float s = 0.0f;
    for (long n = (long)r * rows + y; n < r1; n += COL_LANES) s += x[(size_t)n * C + c];
    return s;
}

// Lane y's two sums of channel c over chunk r for LayerNorm's dw and db:
// sum of norm * dout and of dout, norm = (inp - mean) * rstd.
TWIN_FN void col_lane_sum_ln(float* sw, float* sb, const float* dout, const float* inp,
                             const float* mean, const float* rstd, int N, int C, int c, int r,
                             int y) {
    int rows = col_chunk_rows(N, C);
    long r1 = (long)(r + 1) * rows < N ? (long)(r + 1) * rows : N;
    float w = 0.0f, b = 0.0f;
    for (long n = (long)r * rows + y; n < r1; n += COL_LANES) {
        size_t i = (size_t)n * C + c;
        float norm = (inp[i] - mean[n]) * rstd[n];
        w += norm * dout[i];
        b += dout[i];
    }
    *sw = w;
    *sb = b;
}

// The second pass, thread c: the chunks' sums of column c in chunk order.
TWIN_FN float col_partials_sum(const float* partials, int chunks, int C, int c) {
    float s = 0.0f;
    for (int r = 0; r < chunks; r++) s += partials[(size_t)r * C + c];
    return s;
}

// ---------------------------------------------------------------- MoE gate gradient
// dgates[t, j] += dout[t, :] . rows[pos[t*k + j], :]: a warp of GATE_LANES
// threads per (t, j); lane l sums the products of channels l, l + 32, ...
// in order (the warp reads 32 consecutive floats of each row at a time),
// then the lanes add up in a tree (offset 16, 8, 4, 2, 1: lane l += lane
// l + offset; __shfl_down_sync). The dot's bits depend on C and the two
// rows alone, whatever N, k or the slot's place in the call.
#define GATE_LANES 32

TWIN_FN float dgate_lane_sum(const float* d, const float* x, int C, int lane) {
    float s = 0.0f;
    for (int c = lane; c < C; c += GATE_LANES) s += d[c] * x[c];
    return s;
}

// ---------------------------------------------------------------- attention in O(T) memory
// FlashAttention (Dao et al. 2022; Dao 2023) on the online softmax of
// Milakov & Gimelshein 2018. One description covers the whole-sequence op
// and a (query chunk, kv chunk) pair of the ring: queries i = 0..Tq-1 at
// positions q0 + i, keys j = 0..Tk-1 at k0 + j, key j visible to query i iff
// k0 + j <= q0 + i (attention_flash_* is Tq = Tk = T, q0 = k0 = 0). So a
// ring step is one more block of keys to the same kernel, and the chunk ops'
// merge is the kernel's own rescale, one level up (common/ops.h).
//
// Three kernels, a block per (tile of FLASH_TILE rows, head h, batch row b),
// one thread r per row of the tile, tiles in shared memory (FlashTiles).
// Each is a sequence of phases with a __syncthreads() between them, and
// each phase is a function of one thread below:
//   forward, block = query tile i0:  flash_fwd_begin; for each key tile j0
//     below flash_key_end: flash_load_kv, flash_fwd_step; flash_fwd_end.
//   dk, dv, block = key tile j0:  flash_dkdv_begin; for each query tile i0
//     from flash_first_query(j0) on: flash_load_queries, flash_dkdv_step;
//     flash_dkdv_end.
//   dq, block = query tile i0:  flash_dq_begin; for each key tile j0 below
//     flash_key_end: flash_load_kv, flash_dq_step; flash_dq_end.
// A thread's row sums run in one fixed order on that thread (no atomics):
// the same bits every run, and a row's out, lse and dq whatever the other
// rows. Shared tiles are of two kinds: those every thread reads the same
// row of at once (a broadcast), rows of hs floats; and a thread's own rows,
// of hs + 1 floats, so the 32 threads of a warp reading element c of their
// 32 rows hit 32 different banks (rows of hs, a multiple of 32, would all
// hit one).
#define FLASH_TILE 32  // rows and keys per tile, one thread per row

typedef struct {
    // query i of batch row b at q + (b*Tq + i)*q_stride, heads side by side;
    // key (value) j at k (v) + (b*Tk + j)*kv_stride
    const float *q, *k, *v;
    int q_stride, kv_stride;
    int Tq, Tk, q0, k0;  // rows and positions, as above
    int C, NH;           // head size hs = C / NH
    float scale;         // 1 / sqrt(hs)
    // forward writes out (B, Tq, C) and per (token, head) stat_m, stat_l
    // (B, Tq, NH): finished (finish = 1), out = o / l and stat_m = lse =
    // m + log l (stat_l unused); partials (finish = 0), out = o, stat_m = m,
    // stat_l = l. A row that sees no key: lse or m -INFINITY, l 0, out 0.
    float *out, *stat_m, *stat_l;
    int finish;
    // backward reads dout and the finished out (B, Tq, C) and lse (B, Tq,
    // NH), and ADDS into dq (rows like q) and dk, dv (rows like k, v)
    const float *dout, *lse;
    float *dq, *dk, *dv;
} FlashArgs;

// How many keys of the chunk query i sees: keys 0 .. q0 + i - k0, within 0..Tk.
TWIN_FN int flash_keys_visible(const FlashArgs* a, int i) {
    int n = a->q0 + i - a->k0 + 1;
    return n < 0 ? 0 : (n > a->Tk ? a->Tk : n);
}
// How many keys of the key tile starting at j0 query i sees (0..FLASH_TILE).
TWIN_FN int flash_tile_keys(const FlashArgs* a, int i, int j0) {
    int n = flash_keys_visible(a, i) - j0;
    return n < 0 ? 0 : (n > FLASH_TILE ? FLASH_TILE : n);
}
// The key tiles the query tile starting at i0 meets: keys 0 .. end - 1,
// the keys its last row sees (it sees the most).
TWIN_FN int flash_key_end(const FlashArgs* a, int i0) {
    int last = (i0 + FLASH_TILE < a->Tq ? i0 + FLASH_TILE : a->Tq) - 1;
    return flash_keys_visible(a, last);
}
// The first query that sees key j (Tq: none does).
TWIN_FN int flash_first_query(const FlashArgs* a, int j) {
    int f = j + a->k0 - a->q0;
    return f < 0 ? 0 : (f > a->Tq ? a->Tq : f);
}
TWIN_FN int flash_hs(const FlashArgs* a) { return a->C / a->NH; }

// Shared memory of one block, carved from sm.
typedef struct {
    float *qs, *ks, *vs, *dos;  // tiles of queries, keys, values, dout
    float *acc1, *acc2;         // a thread's sums: o (forward); dk, dv; dq
    float *ps;                  // forward: a row's probabilities for one key tile
    float *lses, *Ds;           // backward: lse and D = dout . out of the query rows
} FlashTiles;
enum { FLASH_FWD, FLASH_DKDV, FLASH_DQ };

// Floats of shared memory for a kernel: own rows (FLASH_TILE, hs + 1),
// broadcast tiles (FLASH_TILE, hs), FLASH_TILE-float columns.
TWIN_FN size_t flash_smem_floats(int kind, int hs) {
    const size_t own = (size_t)FLASH_TILE * (hs + 1), bc = (size_t)FLASH_TILE * hs;
    if (kind == FLASH_FWD) return 2 * own + (size_t)FLASH_TILE * (FLASH_TILE + 1) + 2 * bc;
    if (kind == FLASH_DKDV) return 4 * own + 2 * bc + 2 * FLASH_TILE;
    return 3 * own + 2 * bc + 2 * FLASH_TILE;
}
TWIN_FN FlashTiles flash_tiles(float* sm, int kind, int hs) {
    const size_t own = (size_t)FLASH_TILE * (hs + 1), bc = (size_t)FLASH_TILE * hs;
    FlashTiles t = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    float* p = sm;
    if (kind == FLASH_FWD) {  // own: q, o; p; broadcast: k, v
        t.qs = p, p += own;
        t.acc1 = p, p += own;
        t.ps = p, p += (size_t)FLASH_TILE * (FLASH_TILE + 1);
        t.ks = p, p += bc;
        t.vs = p;
    } else if (kind == FLASH_DKDV) {  // own: k, v, dk, dv; broadcast: q, dout
        t.ks = p, p += own;
        t.vs = p, p += own;
        t.acc1 = p, p += own;
        t.acc2 = p, p += own;
        t.qs = p, p += bc;
        t.dos = p, p += bc;
        t.lses = p, p += FLASH_TILE;
        t.Ds = p;
    } else {  // own: q, dout, dq; broadcast: k, v
        t.qs = p, p += own;
        t.dos = p, p += own;
        t.acc1 = p, p += own;
        t.ks = p, p += bc;
        t.vs = p, p += bc;
        t.lses = p, p += FLASH_TILE;
        t.Ds = p;
    }
    return t;
}

// Thread r's share of loading rows t0 .. t0 + FLASH_TILE - 1 of a (T, hs)
// slice (row stride ld) into dst (row stride dst_ld), zeros past T: every
// thread of the block takes part, element x of the tile is thread x % FLASH_TILE's.
TWIN_FN void flash_load_part(float* dst, int dst_ld, const float* src, int ld, int t0, int T, int hs, int r) {
    for (int x = r; x < FLASH_TILE * hs; x += FLASH_TILE) {
        int row = x / hs, c = x % hs;
        dst[row * dst_ld + c] = t0 + row < T ? src[(size_t)(t0 + row) * ld + c] : 0.0f;
    }
}

// Head h of batch row b: where its q, k, v, and its rows of out, dout and
// the statistics start.
TWIN_FN const float* flash_q(const FlashArgs* a, int b, int h) {
    return a->q + (size_t)b * a->Tq * a->q_stride + (size_t)h * flash_hs(a);
}
TWIN_FN size_t flash_kv_off(const FlashArgs* a, int b, int h) {
    return (size_t)b * a->Tk * a->kv_stride + (size_t)h * flash_hs(a);
}
TWIN_FN size_t flash_out_off(const FlashArgs* a, int b, int i, int h) {
    return ((size_t)b * a->Tq + i) * a->C + (size_t)h * flash_hs(a);
}
TWIN_FN size_t flash_stat_off(const FlashArgs* a, int b, int i, int h) {
    return ((size_t)b * a->Tq + i) * a->NH + h;
}

// The key and value tile starting at j0, rows of dst_ld floats.
TWIN_FN void flash_load_kv(const FlashArgs* a, FlashTiles t, int b, int h, int j0, int dst_ld, int r) {
    const size_t off = flash_kv_off(a, b, h);
    flash_load_part(t.ks, dst_ld, a->k + off, a->kv_stride, j0, a->Tk, flash_hs(a), r);
    flash_load_part(t.vs, dst_ld, a->v + off, a->kv_stride, j0, a->Tk, flash_hs(a), r);
}

// ---- forward
// begin: the query tile (own rows), thread r's o row zeroed.
TWIN_FN void flash_fwd_begin(const FlashArgs* a, FlashTiles t, int b, int h, int i0, int r) {
    const int hs = flash_hs(a);
    flash_load_part(t.qs, hs + 1, flash_q(a, b, h), a->q_stride, i0, a->Tq, hs, r);
    for (int c = 0; c < hs; c++) t.acc1[r * (hs + 1) + c] = 0.0f;
}
// step: row i = i0 + r folds in the keys it sees of the tile at j0
// (ks, vs): its running max m, sum l and unnormalised o, per the online
// softmax  m' = max(m, max s), l' = l e^(m - m') + sum e^(s - m'),
// o' = o e^(m - m') + sum e^(s - m') v.
TWIN_FN void flash_fwd_step(const FlashArgs* a, FlashTiles t, int i0, int j0, int r, float* m, float* l) {
    const int hs = flash_hs(a), hp = hs + 1, i = i0 + r;
    if (i >= a->Tq) return;
    const int nvis = flash_tile_keys(a, i, j0);
    if (nvis == 0) return;
    const float* qr = t.qs + r * hp;
    float* p = t.ps + r * (FLASH_TILE + 1);
    float* o = t.acc1 + r * hp;
    float mx = -INFINITY;
    for (int j = 0; j < nvis; j++) {
        float s = 0.0f;
        for (int c = 0; c < hs; c++) s += qr[c] * t.ks[j * hs + c];
        p[j] = s * a->scale;
        mx = fmaxf(mx, p[j]);
    }
    const float m_new = fmaxf(*m, mx);
    const float alpha = *m == -INFINITY ? 0.0f : expf(*m - m_new);  // first keys: nothing to rescale
    float sum = 0.0f;
    for (int j = 0; j < nvis; j++) {
        p[j] = expf(p[j] - m_new);
        sum += p[j];
    }
    *l = *l * alpha + sum;
    *m = m_new;
    for (int c = 0; c < hs; c++) {
        float acc = 0.0f;
        for (int j = 0; j < nvis; j++) acc += p[j] * t.vs[j * hs + c];
        o[c] = o[c] * alpha + acc;
    }
}
// end: row i's output and statistics, finished or as partials (FlashArgs).
TWIN_FN void flash_fwd_end(const FlashArgs* a, FlashTiles t, int b, int h, int i0, int r, float m, float l) {
    const int hs = flash_hs(a), i = i0 + r;
    if (i >= a->Tq) return;
    float* o = a->out + flash_out_off(a, b, i, h);
    const float* acc = t.acc1 + r * (hs + 1);
    const size_t st = flash_stat_off(a, b, i, h);
    if (a->finish) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int c = 0; c < hs; c++) o[c] = acc[c] * inv;
        a->stat_m[st] = l > 0.0f ? m + logf(l) : -INFINITY;
    } else {
        for (int c = 0; c < hs; c++) o[c] = acc[c];
        a->stat_m[st] = m;
        a->stat_l[st] = l;
    }
}

// ---- backward: p = e^(s - lse), ds = p (dout . v - D) / sqrt(hs)
// Row r of a query tile starting at i0: its lse and D = dout . out (in
// order, by thread r), 0 past Tq (never used).
TWIN_FN void flash_row_stats(const FlashArgs* a, FlashTiles t, int b, int h, int i0, int r) {
    const int hs = flash_hs(a), i = i0 + r;
    float D = 0.0f, L = 0.0f;
    if (i < a->Tq) {
        const size_t off = flash_out_off(a, b, i, h);
        for (int c = 0; c < hs; c++) D += a->dout[off + c] * a->out[off + c];
        L = a->lse[flash_stat_off(a, b, i, h)];
    }
    t.Ds[r] = D;
    t.lses[r] = L;
}

// dk, dv. begin: the key tile's k and v (own rows), thread r's sums zeroed.
TWIN_FN void flash_dkdv_begin(const FlashArgs* a, FlashTiles t, int b, int h, int j0, int r) {
    const int hs = flash_hs(a);
    flash_load_kv(a, t, b, h, j0, hs + 1, r);
    for (int c = 0; c < hs; c++) t.acc1[r * (hs + 1) + c] = t.acc2[r * (hs + 1) + c] = 0.0f;
}
// The query tile starting at i0: q and dout (broadcast) and the rows' stats.
TWIN_FN void flash_load_queries(const FlashArgs* a, FlashTiles t, int b, int h, int i0, int r) {
    const int hs = flash_hs(a);
    flash_load_part(t.qs, hs, flash_q(a, b, h), a->q_stride, i0, a->Tq, hs, r);
    flash_load_part(t.dos, hs, a->dout + flash_out_off(a, b, 0, h), a->C, i0, a->Tq, hs, r);
    flash_row_stats(a, t, b, h, i0, r);
}
// step: key j = j0 + r adds, over the queries of the tile that see it in
// order, dk_j += ds q_i, dv_j += p dout_i.
TWIN_FN void flash_dkdv_step(const FlashArgs* a, FlashTiles t, int i0, int j0, int r) {
    const int hs = flash_hs(a), hp = hs + 1, j = j0 + r;
    if (j >= a->Tk) return;
    const int f = flash_first_query(a, j);
    const int ia = f > i0 ? f : i0, ie = i0 + FLASH_TILE < a->Tq ? i0 + FLASH_TILE : a->Tq;
    for (int i = ia; i < ie; i++) {
        const int qi = i - i0;
        float s = 0.0f, dp = 0.0f;
        for (int c = 0; c < hs; c++) {
            s += t.qs[qi * hs + c] * t.ks[r * hp + c];
            dp += t.dos[qi * hs + c] * t.vs[r * hp + c];
        }
        const float p = expf(s * a->scale - t.lses[qi]);
        const float ds = p * (dp - t.Ds[qi]) * a->scale;
        for (int c = 0; c < hs; c++) {
            t.acc1[r * hp + c] += ds * t.qs[qi * hs + c];
            t.acc2[r * hp + c] += p * t.dos[qi * hs + c];
        }
    }
}
TWIN_FN void flash_dkdv_end(const FlashArgs* a, FlashTiles t, int b, int h, int j0, int r) {
    const int hs = flash_hs(a), j = j0 + r;
    if (j >= a->Tk) return;
    const size_t off = flash_kv_off(a, b, h) + (size_t)j * a->kv_stride;
    for (int c = 0; c < hs; c++) {
        a->dk[off + c] += t.acc1[r * (hs + 1) + c];
        a->dv[off + c] += t.acc2[r * (hs + 1) + c];
    }
}

// dq. begin: the query tile's q and dout (own rows), thread r's stats and sum.
TWIN_FN void flash_dq_begin(const FlashArgs* a, FlashTiles t, int b, int h, int i0, int r) {
    const int hs = flash_hs(a);
    flash_load_part(t.qs, hs + 1, flash_q(a, b, h), a->q_stride, i0, a->Tq, hs, r);
    flash_load_part(t.dos, hs + 1, a->dout + flash_out_off(a, b, 0, h), a->C, i0, a->Tq, hs, r);
    flash_row_stats(a, t, b, h, i0, r);
    for (int c = 0; c < hs; c++) t.acc1[r * (hs + 1) + c] = 0.0f;
}
// step: query i = i0 + r adds, over the keys it sees of the tile at j0 in
// order, dq_i += ds k_j.
TWIN_FN void flash_dq_step(const FlashArgs* a, FlashTiles t, int i0, int j0, int r) {
    const int hs = flash_hs(a), hp = hs + 1, i = i0 + r;
    if (i >= a->Tq) return;
    const int nvis = flash_tile_keys(a, i, j0);
    for (int j = 0; j < nvis; j++) {
        float s = 0.0f, dp = 0.0f;
        for (int c = 0; c < hs; c++) {
            s += t.qs[r * hp + c] * t.ks[j * hs + c];
            dp += t.dos[r * hp + c] * t.vs[j * hs + c];
        }
        const float p = expf(s * a->scale - t.lses[r]);
        const float ds = p * (dp - t.Ds[r]) * a->scale;
        for (int c = 0; c < hs; c++) t.acc1[r * hp + c] += ds * t.ks[j * hs + c];
    }
}
TWIN_FN void flash_dq_end(const FlashArgs* a, FlashTiles t, int b, int h, int i0, int r) {
    const int hs = flash_hs(a), i = i0 + r;
    if (i >= a->Tq) return;
    float* dq = a->dq + ((size_t)b * a->Tq + i) * a->q_stride + (size_t)h * hs;
    for (int c = 0; c < hs; c++) dq[c] += t.acc1[r * (hs + 1) + c];
}

// ---- the ring's merge and finish, one thread per (token, head) row r:
// stats (B, Tq, NH) and out (B, Tq, C) = (B*Tq*NH, hs) list the rows in
// the same order, so row r owns out[r*hs .. r*hs + hs). The CPU ops' loop
// bodies (common/cpu/ops_*.c), so the two give the same bits.
TWIN_FN void flash_merge_row(float* out, float* rowmax, float* sumexp, const float* out2,
                             const float* rowmax2, const float* sumexp2, size_t r, int hs) {
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
TWIN_FN void flash_finish_row(float* out, float* lse, const float* rowmax, const float* sumexp, size_t r,
                              int hs) {
    float l = sumexp[r];
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* o = out + r * hs;
    for (int c = 0; c < hs; c++) o[c] *= inv;
    lse[r] = l > 0.0f ? rowmax[r] + logf(l) : -INFINITY;  // rowmax read first: lse may be rowmax
}

#endif
