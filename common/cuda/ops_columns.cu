// ops_columns.cu: the column sums' partials buffer and second pass
// (ops_columns.cuh), shared by LayerNorm's and the linear layer's backward.
#include "ops_columns.cuh"

static __device__ float col_partials[2 * COL_MAX_PARTIALS];

float* column_partials(void) {
    float* partials = NULL;
    CUDA_CHECK(cudaGetSymbolAddress((void**)&partials, col_partials));
    return partials;
}

__global__ void column_partials_kernel(float* out, const float* partials, int chunks, int C) {
    FOR_EACH_INDEX(c, (size_t)C) out[c] += col_partials_sum(partials, chunks, C, (int)c);
}

void column_partials_add(float* out, const float* partials, int chunks, int C) {
    column_partials_kernel<<<grid_for((size_t)C), THREADS, 0, cuda_compute_stream>>>(out, partials, chunks, C);
    KERNEL_CHECK();
}
