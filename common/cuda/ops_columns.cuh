// ops_columns.cuh: the sums over rows per column that LayerNorm's and the
// linear layer's backward share (ops_layernorm.cu, ops_linear.cu); the
// partials buffer and the second pass are in ops_columns.cu.
#ifndef OPS_COLUMNS_CUH
#define OPS_COLUMNS_CUH

#include "ops_cuda.cuh"

// ---------------------------------------------------------------- sums over rows, per column
// LayerNorm's dw, db and matmul's dbias sum a row-major (N, C) array over its
// rows. A block per column would read with a stride of C: each warp's 32
// loads would touch 32 memory segments. Instead a block takes a tile of
// COL_TILE consecutive columns with COL_LANES row lanes: thread (x, y) sums
// column tile * COL_TILE + x over rows y, y + COL_LANES, ... in order. A warp
// is the 32 threads of one y (x varies fastest), so each of its loads reads
// 32 consecutive floats of one row: one 128-byte segment (two when C is not
// a multiple of 32 and the tile straddles one). Then the lanes of
// each column add up in a tree in shared memory, in a fixed order. (The CPU
// twin walks the rows in order over a block of columns per thread: the same
// shape, one lane.)
// One block per tile alone would be ceil(C / 32) blocks (24 at C = 768),
// fewer than a large GPU's SMs, each walking every row. So the rows are cut
// into chunks of about COL_CHUNK_ROWS too (ops_twin.h, col_chunks): the grid
// is tiles x chunks (768 blocks at C = 768, N = 8192), each block writes its
// chunk's sums to a static partials buffer, and a second kernel adds each
// column's chunks in order. The chunking depends on N and C only, so the
// bits do too (tests/test_cuda_twins.c runs this index logic on the CPU).
// COL_TILE, COL_LANES, COL_CHUNK_ROWS, COL_MAX_PARTIALS: ops_twin.h.
// The partials buffer, 2 x COL_MAX_PARTIALS floats (4 MiB, static device
// memory: one for the program), as a device pointer. A kernel of another
// file cannot name the array itself (no relocatable device code), so the
// column kernels take it as an argument.
float* column_partials(void);

// Every thread of the block passes its lane's partial sum; thread (x, 0)
// gets the total of column x over all lanes. Every thread must call it.
__device__ inline float column_lanes_sum(float v) {
    __shared__ float buf[COL_LANES][COL_TILE];
    buf[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    for (int half = COL_LANES / 2; half > 0; half /= 2) {
        if ((int)threadIdx.y < half) buf[threadIdx.y][threadIdx.x] += buf[threadIdx.y + half][threadIdx.x];
        __syncthreads();
    }
    float total = buf[0][threadIdx.x];
    __syncthreads();  // all have read buf before a next call overwrites it
    return total;
}

// The grid of a column sum: x the tiles of columns, y the chunks of rows.
inline dim3 column_grid(int N, int C) {
    return dim3((unsigned)((C + COL_TILE - 1) / COL_TILE), (unsigned)col_chunks(N, C));
}
inline dim3 column_block(void) { return dim3(COL_TILE, COL_LANES); }

// The second pass: out[c] += the chunks' sums of column c in chunk order
// (partials (chunks, C)), one thread per column, on the compute stream.
void column_partials_add(float* out, const float* partials, int chunks, int C);

#endif
