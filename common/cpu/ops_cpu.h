// ops_cpu.h: what the CPU ops (common/cpu/ops_*.c, one file per op family,
// as common/ops/ has one header per family) share: the progress hook, the
// loop sizes, and the vectorisable exp, sums and dot products that give the
// same bits in every file, every build and every buffer. Private to them.
//
// Threading: loops use OpenMP; OpenBLAS is the OpenMP build, so a cblas call
// made outside a parallel region uses the same thread team, and one made inside
// a parallel region (attention, one head per thread) runs single-threaded.
//
// Progress: the long ops (matmuls, attention) start with progress(), the
// hook the comm layer sets to comm_progress, so non-blocking MPI operations
// in flight move while the rank computes (MPI moves them only inside MPI
// calls; see common/comm.h). A no-op when none is.
#ifndef OPS_CPU_H
#define OPS_CPU_H

#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memory.h"  // xmalloc
#include "optime.h"

// set by ops_set_progress_hook (ops_util.c)
extern void (*ops_progress_hook)(void);
static inline void progress(void) {
    if (ops_progress_hook) ops_progress_hook();
}

// Column sums over rows (a bias's or a LayerNorm weight's gradient) run over
// blocks of this many columns, one block per thread at a time.
#define OPS_COL_BLOCK 64

// Below this many floats ops_add, ops_scale and grad_sumsq run a plain loop. An OpenMP
// "parallel for if (small)" is not free: even when the if-clause is false the
// runtime still sets up a (one-thread) parallel region on every call, which
// costs more than adding a few floats (chapter 1's 8-byte all-reduce showed
// it). An explicit branch keeps small calls to a bare loop.
#define OPS_PARALLEL_MIN 16384

// expf in a form a loop can vectorise: a call to libm's expf keeps a loop
// scalar (one value at a time), while plain arithmetic lets gcc run 8 values
// per AVX instruction. e^x = 2^n e^r with n = round(x / ln 2) and
// r = x - n ln 2 (ln 2 in two parts, Cody-Waite, so r keeps its bits), e^r
// by Cephes' degree-7 polynomial on |r| <= ln 2 / 2, 2^n built in the
// exponent bits. Within 1.4 units of float rounding of the exact e^x on
// [-87, 88] (libm's expf: 1), measured; gelu and the attention softmax use
// it, and tests/test_ops.c holds both to the float64 reference. x is clamped
// to [-87, 88], where e^x stays a normal float; a NaN stays NaN (p is NaN,
// whatever 2^n its conversion gives), so a diverging run still shows it.
static inline float exp_lanes(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;   // ln 2 = 0.693359375 - 2.12194440e-4
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } two_n = {.i = ((int32_t)n + 127) << 23};
    return p * two_n.f;
}

// Sums along a row in an order fixed by the index alone: lane l of
// SUM_LANES adds the elements l, l + SUM_LANES, l + 2 SUM_LANES, ... in
// turn, and the lanes are added as a fixed tree. A `#pragma omp simd
// reduction` would let the compiler pick the split: its vector width (4,
// 8 or 16 lanes with -march=native), an alignment peel that depends on the
// row's address, a scalar remainder that depends on the row's length; the
// same row then sums to other bits in another buffer or on another CPU.
// Here the lanes are explicit, so every build adds alike; gcc still runs
// them as one vector.
#define SUM_LANES 8
static inline float sum_of_lanes(const float acc[SUM_LANES]) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// row[j] = e^(row[j] - mx) for j < n, in place; returns their sum.
static inline float exp_and_sum(float* row, int n, float mx) {
    float acc[SUM_LANES] = {0};
    int j = 0;
    for (; j + SUM_LANES <= n; j += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) {
            row[j + l] = exp_lanes(row[j + l] - mx);
            acc[l] += row[j + l];
        }
    for (int l = 0; j + l < n; l++) {
        row[j + l] = exp_lanes(row[j + l] - mx);
        acc[l] += row[j + l];
    }
    return sum_of_lanes(acc);
}

// sum over j < n of a[j] b[j]
static inline float dot_lanes(const float* a, const float* b, int n) {
    float acc[SUM_LANES] = {0};
    int j = 0;
    for (; j + SUM_LANES <= n; j += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) acc[l] += a[j + l] * b[j + l];
    for (int l = 0; j + l < n; l++) acc[l] += a[j + l] * b[j + l];
    return sum_of_lanes(acc);
}

#endif
