// ops_twin.h: the index logic of three of ops.cu's kernels as plain
// functions of one thread's indices, compiled twice: by nvcc into the kernels
// (ops.cu) and by the C compiler into tests/test_cuda_twins.c, which calls
// them in loops over every thread of the grid on the CPU and checks the
// result against the CPU ops and straightforward references. No GPU runs
// here; this is how the kernels' logic is tested without one.
//   - the embedding backward: the rows sorted by (token, row), then one
//     thread per (run of a token, channel) adding that token's rows in row
//     order (the CPU op's order: the same bits);
//   - column sums (matmul's dbias, LayerNorm's dw and db): chunks of rows,
//     each chunk's sum a tree over lanes, then the chunks' sums in order;
//   - the MoE gate gradient: a warp per (token, slot), lane l summing
//     channels l, l + 32, ... in order, then a tree over the 32 lanes.
// What is not here is the CUDA machinery around the logic: the sort (CUB's
// radix sort, whose output is fixed because the keys are distinct), the
// shared-memory and warp-shuffle trees (the test spells out their pairing).
// C-compatible: no C++ in this file.
#ifndef OPS_TWIN_H
#define OPS_TWIN_H

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

#endif
