// ring.h: context parallelism's token layout and ring attention's compute,
// one K/V block at a time (chapter 6). The communication that moves the
// blocks around the ring is context.c's (cp_ring_forward, cp_ring_backward,
// called where the chapter's main.c runs the ring); this module is what
// a rank computes with the block in hand, so that tests/test_ring.c can run
// the very same code over a simulated ring, no MPI needed.
#ifndef RING_H
#define RING_H

#include <stddef.h>

// Who holds which tokens. A cp rank holds `parts` runs of `len` consecutive
// positions of each of its B sequences of T tokens:
//   balance none:   1 run of T/cp, rank r from position r*T/cp;
//   balance zigzag: 2 runs of T/(2cp), the half-chunks r and 2cp-1-r.
// Its token rows are part-major: row (p*B + b)*len + t is sequence b,
// position cp_shard_pos(s, rank, p) + t. Every op but attention works on
// rows and does not care; attention sees each part as a (B, len) chunk.
typedef struct {
    int cp, rank;  // the cp group's size, this rank's place in it
    int parts;     // 1 (none) or 2 (zigzag)
    int len;       // positions per part
    int B, T;      // this rank's sequences, and their length
} CPShard;

// The first global position of part p on cp rank `rank`.
int cp_shard_pos(const CPShard* s, int rank, int p);
// The cp rank that holds global position pos of a sequence, and pos's row
// there in the first of its sequences (*row), as the capstone's --sample
// finds the row of logits to draw from.
int cp_shard_owner(const CPShard* s, int pos, size_t* row);
// Host int work on token ids: this rank's rows of B whole sequences
// src (B, T), into dst (B*T/cp) in the part-major order above.
void cp_shard_tokens(const CPShard* s, int* dst, const int* src);
// The embedding of this rank's rows, inputs (device, the order above),
// into out (rows, C): each part's rows take wpe (maxT, C) from its first
// position on. Backward: dout into dwte's and dwpe's rows, accumulated.
void cp_shard_encoder_forward(const CPShard* s, float* out, const int* inputs, const float* wte, const float* wpe,
                              int C);
void cp_shard_encoder_backward(const CPShard* s, float* dwte, float* dwpe, const float* dout, const int* inputs,
                               int C);
// A tp group's rows under this layout (the capstone's --tp with --cp):
// each of the tp ranks holds B of the group's B tp sequences, part-major,
// so an all-gather over tp lays the rows out (r, part, b, t); attention
// over the group wants (part, r B + b, t), the part-major order of all B tp
// sequences. to_group 1: the first order (src) into the second (dst); 0:
// back. Blocks of B len rows of C floats move (ops_copy); with one part the
// two orders are the same.
void cp_shard_regroup(const CPShard* s, int tp, float* dst, const float* src, int C, int to_group);
// A (query part at q0, key part at k0) pair leaves some score unmasked iff
// its first key is not after its last query: k0 <= q0 + len - 1.
int cp_pair_visible(const CPShard* s, int q0, int k0);
// Unmasked (query, key) scores of such a pair, per sequence and head.
long cp_pair_scores(const CPShard* s, int q0, int k0);

// A rank's forward state over the ring: the running partials of its query
// parts and the scratch for one pair's. Buffers are device buffers of the
// sizes below (N = B*T/cp rows); rowmax is the caller's lse buffer, which
// ring_forward_finish overwrites with the log-sum-exp.
typedef struct {
    float *o2, *m2, *l2;  // one pair's partials: (B*len, C), (B*len, NH) x 2
    float* sumexp;        // (N, NH) the running sum of exponentials
    int started[2];       // a query part has its first partials
    long scores;          // unmasked scores computed (x B x NH), for the balance
    long skipped;         // fully masked pairs skipped
} RingForward;

// Before the first block: no query part has partials yet.
void ring_forward_begin(RingForward* f);
// The K/V block of cp rank src in hand: kv (N, 2C), packed [k | v] rows in
// src's row order. Folds every unmasked (my query part, src's key part)
// pair into atty (N, C) and rowmax (N, NH) (the first pair of a query part
// writes them, later ones merge by the online-softmax rule); fully masked
// pairs are skipped. qkv (N, 3C) are my rows.
void ring_forward_block(const CPShard* me, RingForward* f, const float* qkv, const float* kv, int src,
                        float* atty, float* rowmax, int C, int NH);
// After the last block: atty /= sumexp; lse = rowmax + log(sumexp), in place.
void ring_forward_finish(const CPShard* me, RingForward* f, float* atty, float* lse, int C, int NH);

// Backward with the K/V block of cp rank src in hand: ACCUMULATES my
// queries' share of the gradient into dqkv's query columns (N, 3C) and into
// dkv (N, 2C) [dk | dv] of src's rows. atty, lse: my finished forward;
// datty (N, C) its gradient.
void ring_backward_block(const CPShard* me, const float* qkv, const float* atty, const float* lse,
                         const float* datty, const float* kv, int src, float* dqkv, float* dkv, int C,
                         int NH);

#endif
