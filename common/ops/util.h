// ops/util.h: the progress hook, the strided copy, zero, scale, copy, add (common/ops.h
// says the conventions). CPU: common/cpu/ops_*.c; CUDA: common/cuda/ops_*.cu.
#ifndef OPS_UTIL_H
#define OPS_UTIL_H

#include <stddef.h>

// ---------------------------------------------------------------- progress
// The long ops (matmuls, attention) call this hook at their start, so the
// comm layer can move its non-blocking operations while the rank computes
// (MPI moves them only inside MPI calls: comm.h's comm_progress, which the
// CPU comm layer hooks in here when an operation goes in flight). NULL: no
// hook. The ops sit below the comm layer and never call it by name.
void ops_set_progress_hook(void (*hook)(void));

// ---------------------------------------------------------------- strided copy
// A 2-D copy: rows rows of cols floats, row r from src + r*src_stride to
// dst + r*dst_stride (strides in floats, >= cols; the two regions do not
// overlap). Packs K and V out of a qkv buffer, and one head group's columns
// out of (or back into) a (N, C) tensor for Ulysses' all-to-all.
void ops_copy_2d(float* dst, int dst_stride, const float* src, int src_stride, int rows, int cols);

// ---------------------------------------------------------------- utilities
void ops_zero(float* x, size_t n);
void ops_scale(float* x, size_t n, float s);
void ops_copy(float* dst, const float* src, size_t n);
// y += x over n values (the reduction step of hand-written collectives).
void ops_add(float* y, const float* x, size_t n);
// dst[i] = (float)src[i], rounded as a C cast (the gradient's sum of squares
// is summed in double and all-reduced as a float).
void ops_double_to_float(float* dst, const double* src, size_t n);

#endif
