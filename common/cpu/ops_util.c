// ops_util.c: zero, scale, copy, add, the strided copy, and the progress hook, on the
// CPU (shapes and semantics: common/ops/util.h).
#include "ops_cpu.h"

void (*ops_progress_hook)(void) = NULL;
void ops_set_progress_hook(void (*hook)(void)) { ops_progress_hook = hook; }

// ---------------------------------------------------------------- utilities

void ops_zero(float* x, size_t n) {
    double t0 = optime_start();
    memset(x, 0, n * sizeof(float));
    optime_stop(OPK_MEMORY, OP_FWD, t0);
}


void ops_scale(float* x, size_t n, float s) {
    double t0 = optime_start();
    if (n <= OPS_PARALLEL_MIN) {
        for (size_t i = 0; i < n; i++) x[i] *= s;
        optime_stop(OPK_MEMORY, OP_FWD, t0);
        return;
    }
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] *= s;
    optime_stop(OPK_MEMORY, OP_FWD, t0);
}

void ops_copy(float* dst, const float* src, size_t n) {
    double t0 = optime_start();
    memcpy(dst, src, n * sizeof(float));
    optime_stop(OPK_MEMORY, OP_FWD, t0);
}

void ops_add(float* y, const float* x, size_t n) {
    // small adds (a collective's chunk of a few floats) are not worth waking
    // the thread team for, or even entering a parallel region (see above)
    if (n <= OPS_PARALLEL_MIN) {
        for (size_t i = 0; i < n; i++) y[i] += x[i];
        return;
    }
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void ops_double_to_float(float* dst, const double* src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}

void ops_copy_2d(float* dst, int dst_stride, const float* src, int src_stride, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    // a row is one memcpy; the rows are short (a head's channels), so threads
    // pay only for many of them
    #pragma omp parallel for if ((size_t)rows * cols > OPS_PARALLEL_MIN)
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * dst_stride, src + (size_t)r * src_stride, (size_t)cols * sizeof(float));
}
