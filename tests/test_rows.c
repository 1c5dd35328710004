// test_rows.c: a row's result depends on that row alone, bit for bit.
//
// The course claims "the same bits" wherever a layout only changes how the
// same rows are cut: --ep-overlap n against n = 1 (chapter 7), microbatches
// against one batch. That holds by construction only if every op that works
// row by row (token by token, or sequence by sequence for attention) gives
// each row the bits it gives when the row is computed alone, whatever
//   - the row's offset in its buffer (its address modulo the vector width:
//     a loop that peels iterations to align its pointer sums in another order),
//   - the number of rows in the call and where the call cuts them (a vector
//     body against its scalar remainder; a matrix kernel for a short batch),
//   - the thread count (OpenMP splits the rows, and OpenBLAS its products).
// For each op, every row is first computed alone (one row, an aligned
// buffer, one thread); then the rows are computed in batches of 1 to 3 times
// the widest vector (16 floats) and odd lengths, at several misalignments,
// cut into chunks, at 1, 2 and 4 threads, and each row must equal its
// alone-result bit for bit. A vector width or alignment that changed a sum's
// order would show here on any CPU that has it; CI runs this program at
// several instruction-set levels (make portability).
//
// The reductions the chapters report are checked the same way: the
// gradient's sum of squares (the norm) at 1, 2 and 4 threads and misaligned.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "device.h"
#include "memory.h"
#include "ops.h"
#include "runtime.h"
#include "test.h"

// ---------------------------------------------------------------- inputs
static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float rng_float(void) {  // uniform in [-1, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}
static float* host_random(size_t n, float scale) {
    float* x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_float();
    return x;
}
static float* dev_from(const float* h, size_t n) {
    float* d = mem_alloc(n * sizeof(float), MEM_OTHER);
    mem_to_device(d, h, n * sizeof(float));
    return d;
}

static void set_threads(int t) {
#ifdef _OPENMP
    omp_set_num_threads(t);
#else
    (void)t;
#endif
}

// ---------------------------------------------------------------- the harness
// A row op: n_in inputs and n_out outputs, each a tensor of rows of its own
// width (floats per row); run() computes n rows from pointers to their first
// row. Outputs that a backward accumulates into start from a fixed prefill.
#define MAX_TENSORS 6
typedef struct RowOp RowOp;
struct RowOp {
    const char* name;
    int rows;                  // how many rows the case holds
    int n_in, n_out;
    int in_w[MAX_TENSORS], out_w[MAX_TENSORS];
    float in_scale[MAX_TENSORS];  // inputs uniform in [-scale, scale); 0: 1
    void (*run)(const RowOp* op, float* const* in, float* const* out, int n);
    void (*fix_inputs)(const RowOp* op, float** in_host);  // may be NULL: make inputs valid (rstd > 0, ...)
    // the op's own fixed tensors and sizes
    const float *w, *b;
    int C, OC, T, NH, V, Vp, E, k, q0, k0, Tk;
};

typedef struct {
    float* in_host[MAX_TENSORS];   // (rows, in_w) each
    float* prefill[MAX_TENSORS];   // (rows, out_w): what outputs start from
    float* alone[MAX_TENSORS];     // (rows, out_w): each row computed alone
} RowData;

// Copies rows [r0, r0 + n) of every input into fresh device buffers that
// start `shift` floats past a 64-byte boundary, prefills the outputs the same
// way, runs the op on them and fetches the outputs into got[j] (n rows).
static void run_rows(const RowOp* op, const RowData* d, int r0, int n, int shift, float** got) {
    float* in_dev[MAX_TENSORS];
    float* out_dev[MAX_TENSORS];
    float* in_base[MAX_TENSORS];
    float* out_base[MAX_TENSORS];
    for (int i = 0; i < op->n_in; i++) {
        size_t w = (size_t)op->in_w[i];
        in_base[i] = mem_alloc(((size_t)n * w + (size_t)shift) * sizeof(float), MEM_OTHER);
        in_dev[i] = in_base[i] + shift;
        mem_to_device(in_dev[i], d->in_host[i] + (size_t)r0 * w, (size_t)n * w * sizeof(float));
    }
    for (int j = 0; j < op->n_out; j++) {
        size_t w = (size_t)op->out_w[j];
        out_base[j] = mem_alloc(((size_t)n * w + (size_t)shift) * sizeof(float), MEM_OTHER);
        out_dev[j] = out_base[j] + shift;
        mem_to_device(out_dev[j], d->prefill[j] + (size_t)r0 * w, (size_t)n * w * sizeof(float));
    }
    op->run(op, in_dev, out_dev, n);
    for (int j = 0; j < op->n_out; j++) mem_to_host(got[j], out_dev[j], (size_t)n * op->out_w[j] * sizeof(float));
    for (int i = 0; i < op->n_in; i++) mem_free(in_base[i]);
    for (int j = 0; j < op->n_out; j++) mem_free(out_base[j]);
}

// The first row of rows [0, n) of got that differs from d->alone at rows
// [r0, r0 + n), or -1.
static int first_mismatch(const RowOp* op, const RowData* d, float* const* got, int r0, int n, int* which) {
    for (int r = 0; r < n; r++)
        for (int j = 0; j < op->n_out; j++) {
            size_t w = (size_t)op->out_w[j];
            if (memcmp(got[j] + (size_t)r * w, d->alone[j] + (size_t)(r0 + r) * w, w * sizeof(float))) {
                *which = j;
                return r;
            }
        }
    return -1;
}

static void test_row_op(const RowOp* op) {
    RowData d;
    for (int i = 0; i < op->n_in; i++)
        d.in_host[i] = host_random((size_t)op->rows * op->in_w[i], op->in_scale[i] > 0 ? op->in_scale[i] : 1.0f);
    if (op->fix_inputs) op->fix_inputs(op, d.in_host);
    float* got[MAX_TENSORS];
    for (int j = 0; j < op->n_out; j++) {
        size_t n = (size_t)op->rows * op->out_w[j];
        d.prefill[j] = host_random(n, 0.5f);
        for (size_t i = 0; i < n; i++) d.prefill[j][i] = fabsf(d.prefill[j][i]);  // AdamW's v >= 0
        d.alone[j] = xmalloc(n * sizeof(float));
        got[j] = xmalloc(n * sizeof(float));
    }
    // every row alone: one row, aligned, one thread
    set_threads(1);
    float* one[MAX_TENSORS];
    for (int r = 0; r < op->rows; r++) {
        for (int j = 0; j < op->n_out; j++) one[j] = d.alone[j] + (size_t)r * op->out_w[j];
        run_rows(op, &d, r, 1, 0, one);
    }
    // batches: lengths around 1, 2 and 3 vectors of 16 floats and odd ones,
    // each at four misalignments (0, 1, 3 and 7 floats past 64 bytes)
    static const int lengths[] = {2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49};
    static const int shifts[] = {0, 1, 3, 7};
    static const int threads[] = {1, 2, 4};
    static const int chunks[] = {1, 5, 16, 17};
    char why[256] = "";
    int calls = 0, bad = 0;
    for (int ti = 0; ti < 3 && !bad; ti++) {
        set_threads(threads[ti]);
        for (int li = 0; li < (int)(sizeof(lengths) / sizeof(lengths[0])) && !bad; li++) {
            int n = lengths[li] < op->rows ? lengths[li] : op->rows;
            int r0 = (li * 5) % (op->rows - n + 1);
            for (int si = 0; si < 4 && !bad; si++) {
                int which, r;
                run_rows(op, &d, r0, n, shifts[si], got);
                calls++;
                if ((r = first_mismatch(op, &d, got, r0, n, &which)) >= 0) {
                    snprintf(why, sizeof(why), "row %d of a batch of %d at rows %d.. (%d floats past 64 bytes, %d threads): output %d differs from the row alone",
                             r, n, r0, shifts[si], threads[ti], which);
                    bad = 1;
                }
            }
        }
        // every row, cut into chunks of c rows: the chunks follow each other
        // in one buffer, so a chunk starts wherever the one before it ended
        for (int ci = 0; ci < 4 && !bad; ci++) {
            int c = chunks[ci];
            float* in_dev[MAX_TENSORS];
            float* out_dev[MAX_TENSORS];
            for (int i = 0; i < op->n_in; i++) in_dev[i] = dev_from(d.in_host[i], (size_t)op->rows * op->in_w[i]);
            for (int j = 0; j < op->n_out; j++) out_dev[j] = dev_from(d.prefill[j], (size_t)op->rows * op->out_w[j]);
            for (int r0 = 0; r0 < op->rows; r0 += c) {
                int n = op->rows - r0 < c ? op->rows - r0 : c;
                float* ip[MAX_TENSORS];
                float* op_[MAX_TENSORS];
                for (int i = 0; i < op->n_in; i++) ip[i] = in_dev[i] + (size_t)r0 * op->in_w[i];
                for (int j = 0; j < op->n_out; j++) op_[j] = out_dev[j] + (size_t)r0 * op->out_w[j];
                op->run(op, ip, op_, n);
                calls++;
            }
            for (int j = 0; j < op->n_out; j++) mem_to_host(got[j], out_dev[j], (size_t)op->rows * op->out_w[j] * sizeof(float));
            int which, r = first_mismatch(op, &d, got, 0, op->rows, &which);
            if (r >= 0) {
                snprintf(why, sizeof(why), "row %d of %d cut into chunks of %d (%d threads): output %d differs from the row alone",
                         r, op->rows, c, threads[ti], which);
                bad = 1;
            }
            for (int i = 0; i < op->n_in; i++) mem_free(in_dev[i]);
            for (int j = 0; j < op->n_out; j++) mem_free(out_dev[j]);
        }
    }
    char name[256];
    // the same bits by construction is what this holds each row op to: (b) of docs/notes/bit_for_bit.md
    snprintf(name, sizeof(name), "rows: %s, each of %d rows the same bits as alone (%d calls: 1-4 threads, 4 offsets, 14 lengths, 4 chunkings)",
             op->name, op->rows, calls);
    check(!bad, name, "%s", why);
    set_threads(1);
    for (int i = 0; i < op->n_in; i++) free(d.in_host[i]);
    for (int j = 0; j < op->n_out; j++) free(d.prefill[j]), free(d.alone[j]), free(got[j]);
}

// ---------------------------------------------------------------- the ops
// Rows of tokens: C = 67 channels (not a multiple of any vector), so rows
// fall at every alignment.
#define ROWS 53

static void run_layernorm_fwd(const RowOp* op, float* const* in, float* const* out, int n) {
    layernorm_forward(out[0], out[1], out[2], in[0], op->w, op->b, n, op->C);
}
static void fix_layernorm_bwd(const RowOp* op, float** in) {
    // mean, rstd of each row as forward computes them (rstd > 0)
    for (int r = 0; r < op->rows; r++) {
        double m = 0, v = 0;
        const float* x = in[1] + (size_t)r * op->C;
        for (int c = 0; c < op->C; c++) m += x[c];
        m /= op->C;
        for (int c = 0; c < op->C; c++) v += (x[c] - m) * (x[c] - m);
        in[2][r] = (float)m;
        in[3][r] = (float)(1.0 / sqrt(v / op->C + 1e-5));
    }
}
static void run_layernorm_bwd(const RowOp* op, float* const* in, float* const* out, int n) {
    layernorm_backward(out[0], NULL, NULL, in[0], in[1], op->w, in[2], in[3], n, op->C);
}
// The row-by-row matmuls. (matmul_forward and matmul_backward, BLAS's
// gemm, make no such promise and are not held to it: OpenBLAS's kernels
// pick their blocking from the call's shape, ops.h.)
static void run_matmul_fwd(const RowOp* op, float* const* in, float* const* out, int n) {
    matmul_forward_rowwise(out[0], in[0], op->w, op->b, n, op->C, op->OC);
}
static void run_matmul_bwd(const RowOp* op, float* const* in, float* const* out, int n) {
    matmul_backward_input_rowwise(out[0], in[0], op->w, n, op->C, op->OC);
}
static void run_gelu_fwd(const RowOp* op, float* const* in, float* const* out, int n) {
    gelu_forward(out[0], in[0], (size_t)n * op->C);
}
static void run_gelu_bwd(const RowOp* op, float* const* in, float* const* out, int n) {
    gelu_backward(out[0], in[0], in[1], (size_t)n * op->C);
}
static void run_residual(const RowOp* op, float* const* in, float* const* out, int n) {
    residual_forward(out[0], in[0], in[1], (size_t)n * op->C);
    residual_backward(out[1], out[2], in[0], (size_t)n * op->C);
}
static void run_adamw(const RowOp* op, float* const* in, float* const* out, int n) {
    AdamWConfig cfg = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f};
    // params, m, v in place (outputs; prefilled >= 0, as v must be); grads the input
    adamw_update(out[0], in[0], out[1], out[2], (size_t)n * op->C, cfg, 3, 0.75f);
}

// Cross-entropy: logits rows of Vp floats, the first V valid; the target of
// each row in the input's last float (an int, as a float: small and exact).
static void fix_targets(const RowOp* op, float** in) {
    for (int r = 0; r < op->rows; r++) in[1][r] = (float)((r * 37) % op->V);
}
static int* targets_dev(const float* t_dev, int n) {
    float* th = xmalloc((size_t)n * sizeof(float));
    int* ti = xmalloc((size_t)n * sizeof(int));
    mem_to_host(th, t_dev, (size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) ti[i] = (int)th[i];
    int* d = mem_alloc((size_t)n * sizeof(int), MEM_OTHER);
    mem_to_device(d, ti, (size_t)n * sizeof(int));
    free(th), free(ti);
    return d;
}
static void run_crossentropy(const RowOp* op, float* const* in, float* const* out, int n) {
    int* t = targets_dev(in[1], n);
    // out[0..2]: rowmax, sumexp, tlogit; out[3]: the loss; out[4]: dlogits
    crossentropy_partials(out[0], out[1], out[2], in[0], t, n, op->Vp, op->V, 0);
    crossentropy_loss(out[3], out[0], out[1], out[2], n);
    crossentropy_backward(out[4], in[0], t, out[0], out[1], 0.125f, n, op->Vp, op->V, 0);
    mem_free(t);
}

// Router: logits (E) a row; probs, gates and the chosen experts (as floats),
// then its backward with an aux gradient per expert.
static void run_router(const RowOp* op, float* const* in, float* const* out, int n) {
    int* idx = mem_alloc((size_t)n * op->k * sizeof(int), MEM_OTHER);
    float aux[8] = {0.01f, -0.02f, 0.003f, 0.04f, -0.005f, 0.006f, 0.007f, -0.008f};
    float* aux_dev = dev_from(aux, (size_t)op->E);
    moe_router_forward(out[0], idx, out[1], in[0], n, op->E, op->k);
    moe_router_backward(out[2], in[1], aux_dev, out[0], idx, out[1], n, op->E, op->k);
    mem_free(idx), mem_free(aux_dev);
}

// Combine: a token's k expert rows (k*C floats of the input) and gates;
// forward writes the weighted sum, backward the rows' and gates' gradients.
// A slot whose gate is below -0.6 is dropped (pos -1), a property of the row.
static void run_combine(const RowOp* op, float* const* in, float* const* out, int n) {
    int k = op->k, C = op->C;
    int* pos_h = xmalloc((size_t)n * k * sizeof(int));
    float* gates = xmalloc((size_t)n * k * sizeof(float));
    mem_to_host(gates, in[1], (size_t)n * k * sizeof(float));
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) pos_h[t * k + j] = gates[t * k + j] < -0.6f ? -1 : t * k + j;
    free(gates);
    int* pos = mem_alloc((size_t)n * k * sizeof(int), MEM_OTHER);
    mem_to_device(pos, pos_h, (size_t)n * k * sizeof(int));
    moe_combine_forward(out[0], in[0], in[1], pos, n, k, C);
    moe_combine_backward(out[1], out[2], in[2], in[0], in[1], pos, n, k, C);
    moe_gather_backward(out[3], in[0], pos, n, k, C);
    mem_free(pos), free(pos_h);
}

// Sequences: a row is one sequence of T tokens (attention mixes a
// sequence's tokens, never two sequences'). T = 70 crosses a causal block
// of 64 rows; C = 24 in NH = 2 heads of 12.
static void run_attention_fwd(const RowOp* op, float* const* in, float* const* out, int n) {
    attention_forward(out[0], out[1], in[0], n, op->T, op->C, op->NH);
}
static void run_attention_bwd(const RowOp* op, float* const* in, float* const* out, int n) {
    // forward first (att), then backward into dqkv; datt is scratch
    size_t att = (size_t)n * op->NH * op->T * op->T;
    float* o = mem_alloc((size_t)n * op->T * op->C * sizeof(float), MEM_OTHER);
    float* a = mem_alloc(att * sizeof(float), MEM_OTHER);
    float* da = mem_alloc(att * sizeof(float), MEM_OTHER);
    attention_forward(o, a, in[0], n, op->T, op->C, op->NH);
    attention_backward(out[0], da, in[1], in[0], a, n, op->T, op->C, op->NH);
    mem_free(o), mem_free(a), mem_free(da);
}
// A pair of chunks: queries at q0.., keys at k0.. (Tq = T queries, Tk
// keys), forward partials merged with a second kv chunk, finished, then the
// backward of the pair.
static void run_attention_chunk(const RowOp* op, float* const* in, float* const* out, int n) {
    int T = op->T, Tk = op->Tk, C = op->C, NH = op->NH;
    float* q = in[0];                          // (n, T, C)
    float* kv = in[1];                         // (n, Tk, 2C): [k | v]
    float* kv2 = in[2];                        // (n, Tk, 2C): the second chunk, at k0 + Tk
    float* dout = in[3];                       // (n, T, C)
    float *o = out[0], *se = out[1], *dq = out[2], *dkv = out[3];
    size_t stats = (size_t)n * T * NH;
    float* mx = mem_alloc(stats * sizeof(float), MEM_OTHER);  // the row maxima, then lse in place
    float* o2 = mem_alloc((size_t)n * T * C * sizeof(float), MEM_OTHER);
    float* mx2 = mem_alloc(stats * sizeof(float), MEM_OTHER);
    float* se2 = mem_alloc(stats * sizeof(float), MEM_OTHER);
    attention_chunk_forward(o, mx, se, q, C, kv, kv + C, 2 * C, n, T, Tk, op->q0, op->k0, C, NH);
    attention_chunk_forward(o2, mx2, se2, q, C, kv2, kv2 + C, 2 * C, n, T, Tk, op->q0, op->k0 + Tk, C, NH);
    attention_chunk_merge(o, mx, se, o2, mx2, se2, n, T, C, NH);
    attention_chunk_finish(o, mx, mx, se, n, T, C, NH);
    attention_chunk_backward(dq, dkv, dkv + C, dout, o, mx, q, C, kv, kv + C, 2 * C, n, T, Tk, op->q0, op->k0,
                             C, NH);
    mem_free(mx), mem_free(o2), mem_free(mx2), mem_free(se2);
}

// The memory-efficient attention: forward (out, lse), then its backward
// into dqkv from forward's out and lse.
static void run_attention_flash_fwd(const RowOp* op, float* const* in, float* const* out, int n) {
    attention_flash_forward(out[0], out[1], in[0], n, op->T, op->C, op->NH);
}
static void run_attention_flash_bwd(const RowOp* op, float* const* in, float* const* out, int n) {
    float* o = mem_alloc((size_t)n * op->T * op->C * sizeof(float), MEM_OTHER);
    float* lse = mem_alloc((size_t)n * op->T * op->NH * sizeof(float), MEM_OTHER);
    attention_flash_forward(o, lse, in[0], n, op->T, op->C, op->NH);
    attention_flash_backward(out[0], in[1], in[0], o, lse, n, op->T, op->C, op->NH);
    mem_free(o), mem_free(lse);
}

// A token of the memory-efficient attention: its out, lse and dq depend on
// its query, the keys and values it sees and (backward) its dout, out and
// lse, never on the tokens after it. So the first t tokens of a sequence of
// T give the bits the same t tokens give as a sequence of their own, for t
// around the kernel's blocks of 64 (a row then falls in a full tile in one
// call and in an edge tile in the other). dk and dv are left out: the
// queries after a key add to them.
static void test_flash_prefix(int C, int NH) {
    enum { T = 150 };
    static const int prefixes[] = {1, 7, 63, 64, 65, 100, 128, 129};
    float* qkv_h = host_random((size_t)T * 3 * C, 1.0f);
    float* dout_h = host_random((size_t)T * C, 1.0f);
    float *qkv = dev_from(qkv_h, (size_t)T * 3 * C), *dout = dev_from(dout_h, (size_t)T * C);
    float* o = mem_alloc((size_t)T * C * sizeof(float), MEM_OTHER);
    float* lse = mem_alloc((size_t)T * NH * sizeof(float), MEM_OTHER);
    float* dq = mem_alloc((size_t)T * 3 * C * sizeof(float), MEM_OTHER);
    float* full[3] = {xmalloc((size_t)T * C * sizeof(float)), xmalloc((size_t)T * NH * sizeof(float)),
                      xmalloc((size_t)T * 3 * C * sizeof(float))};
    float* part[3] = {xmalloc((size_t)T * C * sizeof(float)), xmalloc((size_t)T * NH * sizeof(float)),
                      xmalloc((size_t)T * 3 * C * sizeof(float))};
    char why[200] = "";
    int bad = 0;
    for (int ti = 1; ti <= 4 && !bad; ti *= 2) {
        set_threads(ti);
        for (int pi = -1; pi < (int)(sizeof(prefixes) / sizeof(prefixes[0])) && !bad; pi++) {
            int t = pi < 0 ? T : prefixes[pi];
            float** got = pi < 0 ? full : part;
            mem_zero(dq, (size_t)T * 3 * C * sizeof(float));
            attention_flash_forward(o, lse, qkv, 1, t, C, NH);
            attention_flash_backward(dq, dout, qkv, o, lse, 1, t, C, NH);
            mem_to_host(got[0], o, (size_t)t * C * sizeof(float));
            mem_to_host(got[1], lse, (size_t)t * NH * sizeof(float));
            mem_to_host(got[2], dq, (size_t)t * 3 * C * sizeof(float));
            if (pi < 0) continue;
            for (int r = 0; r < t && !bad; r++) {
                const char* what = memcmp(full[0] + (size_t)r * C, part[0] + (size_t)r * C, C * sizeof(float)) ? "out"
                                   : memcmp(full[1] + (size_t)r * NH, part[1] + (size_t)r * NH, NH * sizeof(float)) ? "lse"
                                   : memcmp(full[2] + (size_t)r * 3 * C, part[2] + (size_t)r * 3 * C, C * sizeof(float)) ? "dq"
                                   : NULL;
                if (what) {
                    snprintf(why, sizeof(why), "token %d: %s differs between a sequence of %d and of %d (%d threads)", r,
                             what, t, T, ti);
                    bad = 1;
                }
            }
        }
    }
    char name[240];
    snprintf(name, sizeof(name), "rows: attention_flash_forward and _backward (C %d, %d heads), each token's out, lse and dq the same bits in a sequence of 150 as in its first 1, 7, 63, 64, 65, 100, 128, 129 tokens (1, 2, 4 threads)",
             C, NH);
    check(!bad, name, "%s", why);
    set_threads(1);
    mem_free(qkv), mem_free(dout), mem_free(o), mem_free(lse), mem_free(dq);
    for (int i = 0; i < 3; i++) free(full[i]), free(part[i]);
    free(qkv_h), free(dout_h);
}

// ---------------------------------------------------------------- reductions
// The gradient's sum of squares, which the norm of every step record comes
// from: the same bits at 1, 2 and 4 threads and at any misalignment, for
// lengths around the block the sum is cut into.
static void test_sumsq(void) {
    size_t n = 70001;
    float* g = host_random(n, 1.0f);
    double* s = mem_alloc(sizeof(double), MEM_OTHER);
    float* buf = mem_alloc((n + 8) * sizeof(float), MEM_OTHER);
    int bad = 0;
    char why[200] = "";
    static const size_t lengths[] = {1, 17, 4095, 4096, 4097, 70001};
    for (int li = 0; li < 6 && !bad; li++) {
        size_t len = lengths[li];
        double ref = 0.0, got;
        for (int ti = 1; ti <= 4 && !bad; ti *= 2) {
            for (int shift = 0; shift < 8 && !bad; shift += 3) {
                // the same floats, `shift` floats past a 64-byte boundary
                set_threads(ti);
                mem_to_device(buf + shift, g, len * sizeof(float));
                mem_zero(s, sizeof(double));
                grad_sumsq(s, buf + shift, len);
                mem_to_host(&got, s, sizeof(double));
                if (ti == 1 && shift == 0) ref = got;
                if (memcmp(&got, &ref, sizeof(double))) {
                    snprintf(why, sizeof(why), "%zu floats at %d threads, %d floats past 64 bytes: %.17g; 1 thread, aligned: %.17g",
                             len, ti, shift, got, ref);
                    bad = 1;
                }
            }
        }
    }
    check(!bad, "rows: grad_sumsq (the norm's sum of squares), the same bits at 1, 2 and 4 threads and at any misalignment",
          "%s", why);
    set_threads(1);
    mem_free(s), mem_free(buf), free(g);
}

// The row-by-row products' contract itself (ops/linear.h): each element the
// sum over k in order, a multiply then an add, then + bias (forward) or added
// into dinp (backward), written here as the plain loop that states it (the
// product a statement of its own: no contraction into a fused multiply-add).
// The full tiles, a call's last rows and the last panel's columns must all
// give these bits; the row tests above compare a row only with itself alone,
// which an order that changed everywhere at once would pass.
static void test_rowwise_order(const float* w, const float* b, const float* w_dev, const float* b_dev, int C,
                               int OC) {
    int N = ROWS;
    float *x = host_random((size_t)N * C, 1.0f), *d = host_random((size_t)N * OC, 1.0f);
    float* prior = host_random((size_t)N * C, 1.0f);  // what dinp holds before the call adds into it
    float *x_dev = dev_from(x, (size_t)N * C), *d_dev = dev_from(d, (size_t)N * OC);
    float *o_dev = dev_from(d, (size_t)N * OC), *g_dev = dev_from(prior, (size_t)N * C);
    set_threads(2);
    matmul_forward_rowwise(o_dev, x_dev, w_dev, b_dev, N, C, OC);
    matmul_backward_input_rowwise(g_dev, d_dev, w_dev, N, C, OC);
    float *out = xmalloc((size_t)N * OC * sizeof(float)), *dinp = xmalloc((size_t)N * C * sizeof(float));
    mem_to_host(out, o_dev, (size_t)N * OC * sizeof(float));
    mem_to_host(dinp, g_dev, (size_t)N * C * sizeof(float));
    int bad = 0;
    char why[200] = "";
    for (int n = 0; n < N && !bad; n++)
        for (int o = 0; o < OC && !bad; o++) {
            float sum = 0.0f;
            for (int c = 0; c < C; c++) {
                float product = x[(size_t)n * C + c] * w[(size_t)o * C + c];
                sum = sum + product;
            }
            float want = sum + b[o];
            if (memcmp(&want, &out[(size_t)n * OC + o], sizeof(float)))
                bad = 1, snprintf(why, sizeof(why), "forward row %d column %d: %.9g, the loop %.9g", n, o,
                                  out[(size_t)n * OC + o], want);
        }
    for (int n = 0; n < N && !bad; n++)
        for (int c = 0; c < C && !bad; c++) {
            float sum = 0.0f;
            for (int o = 0; o < OC; o++) {
                float product = d[(size_t)n * OC + o] * w[(size_t)o * C + c];
                sum = sum + product;
            }
            float want = prior[(size_t)n * C + c] + sum;
            if (memcmp(&want, &dinp[(size_t)n * C + c], sizeof(float)))
                bad = 1, snprintf(why, sizeof(why), "input gradient row %d column %d: %.9g, the loop %.9g", n, c,
                                  dinp[(size_t)n * C + c], want);
        }
    check(!bad, "rows: matmul_forward_rowwise and matmul_backward_input_rowwise equal the plain in-order loop "
          "bit for bit (53 rows, C 67, OC 45: full tiles, a call's last rows, the last panel's columns)", "%s", why);
    set_threads(1);
    mem_free(x_dev), mem_free(d_dev), mem_free(o_dev), mem_free(g_dev);
    free(x), free(d), free(prior), free(out), free(dinp);
}

int main(int argc, char** argv) {
    runtime_init(&argc, &argv);
    device_init(0);
    int C = 67, OC = 45, V = 61, Vp = 64, E = 6, k = 2, T = 70, CA = 24, NH = 2;
    float* w = host_random((size_t)OC * C, 0.3f);
    float* b = host_random((size_t)OC, 0.3f);
    float* lw = host_random((size_t)C, 1.0f);
    float* lb = host_random((size_t)C, 1.0f);
    float *w_dev = dev_from(w, (size_t)OC * C), *b_dev = dev_from(b, (size_t)OC);
    float *lw_dev = dev_from(lw, (size_t)C), *lb_dev = dev_from(lb, (size_t)C);
    RowOp ops[] = {
        {.name = "layernorm_forward", .rows = ROWS, .n_in = 1, .n_out = 3, .in_w = {C}, .out_w = {C, 1, 1},
         .run = run_layernorm_fwd, .w = lw_dev, .b = lb_dev, .C = C},
        {.name = "layernorm_backward (dinp)", .rows = ROWS, .n_in = 4, .n_out = 1, .in_w = {C, C, 1, 1}, .out_w = {C},
         .run = run_layernorm_bwd, .fix_inputs = fix_layernorm_bwd, .w = lw_dev, .C = C},
        {.name = "matmul_forward_rowwise", .rows = ROWS, .n_in = 1, .n_out = 1, .in_w = {C}, .out_w = {OC},
         .run = run_matmul_fwd, .w = w_dev, .b = b_dev, .C = C, .OC = OC},
        {.name = "matmul_backward_input_rowwise", .rows = ROWS, .n_in = 1, .n_out = 1, .in_w = {OC}, .out_w = {C},
         .run = run_matmul_bwd, .w = w_dev, .C = C, .OC = OC},
        {.name = "gelu_forward", .rows = ROWS, .n_in = 1, .n_out = 1, .in_w = {C}, .out_w = {C}, .in_scale = {4.0f},
         .run = run_gelu_fwd, .C = C},
        {.name = "gelu_backward", .rows = ROWS, .n_in = 2, .n_out = 1, .in_w = {C, C}, .out_w = {C}, .in_scale = {4.0f, 1.0f},
         .run = run_gelu_bwd, .C = C},
        {.name = "residual_forward and _backward", .rows = ROWS, .n_in = 2, .n_out = 3, .in_w = {C, C}, .out_w = {C, C, C},
         .run = run_residual, .C = C},
        {.name = "adamw_update", .rows = ROWS, .n_in = 1, .n_out = 3, .in_w = {C}, .out_w = {C, C, C},
         .run = run_adamw, .C = C},
        {.name = "crossentropy (partials, loss, backward; V 61 of 64)", .rows = ROWS, .n_in = 2, .n_out = 5,
         .in_w = {Vp, 1}, .out_w = {1, 1, 1, 1, Vp}, .in_scale = {3.0f, 1.0f}, .run = run_crossentropy,
         .fix_inputs = fix_targets, .V = V, .Vp = Vp},
        {.name = "moe_router_forward and _backward (E 6, k 2)", .rows = ROWS, .n_in = 2, .n_out = 3,
         .in_w = {E, k}, .out_w = {E, k, E}, .in_scale = {2.0f, 1.0f}, .run = run_router, .E = E, .k = k},
        {.name = "moe_combine, its backward and moe_gather_backward (k 2)", .rows = ROWS, .n_in = 3, .n_out = 4,
         .in_w = {k * C, k, C}, .out_w = {C, k * C, k, C}, .run = run_combine, .C = C, .k = k},
        {.name = "attention_forward (sequences of 70)", .rows = 11, .n_in = 1, .n_out = 2, .in_w = {T * 3 * CA},
         .out_w = {T * CA, NH * T * T}, .run = run_attention_fwd, .T = T, .C = CA, .NH = NH},
        {.name = "attention_backward (sequences of 70)", .rows = 11, .n_in = 2, .n_out = 1,
         .in_w = {T * 3 * CA, T * CA}, .out_w = {T * 3 * CA}, .run = run_attention_bwd, .T = T, .C = CA, .NH = NH},
        {.name = "attention_chunk_forward, _merge, _finish, _backward (chunks of 37 and 2 x 29)", .rows = 11, .n_in = 4,
         .n_out = 4, .in_w = {37 * CA, 29 * 2 * CA, 29 * 2 * CA, 37 * CA}, .out_w = {37 * CA, 37 * NH, 37 * CA, 29 * 2 * CA},
         .run = run_attention_chunk, .T = 37, .Tk = 29, .q0 = 40, .k0 = 11, .C = CA, .NH = NH},
        {.name = "attention_flash_forward (sequences of 70, heads of 12)", .rows = 11, .n_in = 1, .n_out = 2,
         .in_w = {T * 3 * CA}, .out_w = {T * CA, T * NH}, .run = run_attention_flash_fwd, .T = T, .C = CA, .NH = NH},
        {.name = "attention_flash_backward (sequences of 70, heads of 12)", .rows = 11, .n_in = 2, .n_out = 1,
         .in_w = {T * 3 * CA, T * CA}, .out_w = {T * 3 * CA}, .run = run_attention_flash_bwd, .T = T, .C = CA, .NH = NH},
        // heads of 64: the CPU kernel's vector tiles, not only its edges
        {.name = "attention_flash_forward (sequences of 70, heads of 64)", .rows = 7, .n_in = 1, .n_out = 2,
         .in_w = {T * 3 * 128}, .out_w = {T * 128, T * 2}, .run = run_attention_flash_fwd, .T = T, .C = 128, .NH = 2},
        {.name = "attention_flash_backward (sequences of 70, heads of 64)", .rows = 7, .n_in = 2, .n_out = 1,
         .in_w = {T * 3 * 128, T * 128}, .out_w = {T * 3 * 128}, .run = run_attention_flash_bwd, .T = T, .C = 128, .NH = 2},
    };
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) test_row_op(&ops[i]);
    test_flash_prefix(CA, NH);
    test_flash_prefix(128, 2);
    test_rowwise_order(w, b, w_dev, b_dev, C, OC);
    test_sumsq();
    mem_free(w_dev), mem_free(b_dev), mem_free(lw_dev), mem_free(lb_dev);
    free(w), free(b), free(lw), free(lb);
    int rc = test_exit_code();
    runtime_finalize();
    return rc;
}
