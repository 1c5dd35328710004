// ring.c: see ring.h. Ring attention's compute per K/V block, on the
// chunk-attention ops of common/ops.h; every loop here is over a few
// (query part, key part) pairs, never over tensor data.
#include "ring.h"

#include <string.h>

#include "exercise.h"  // exercise_not_done, in a homework tree
#include "ops.h"

int cp_shard_pos(const CPShard* s, int rank, int p) {
    // EXERCISE 1: the layout: the first position of part p on cp rank `rank`, for the plain cut (one part of len) and zigzag (half-chunks rank and 2cp-1-rank)
    if (s->parts == 1) return rank * s->len;
    return (p == 0 ? rank : 2 * s->cp - 1 - rank) * s->len;
    // END EXERCISE 1
}

int cp_shard_owner(const CPShard* s, int pos, size_t* row) {
    int owner = 0;
    for (int c = 0; c < s->cp; c++)
        for (int p = 0; p < s->parts; p++) {
            int pos0 = cp_shard_pos(s, c, p);
            if (pos0 <= pos && pos < pos0 + s->len) owner = c, *row = (size_t)p * s->B * s->len + (size_t)(pos - pos0);
        }
    return owner;
}

void cp_shard_tokens(const CPShard* s, int* dst, const int* src) {
    for (int p = 0; p < s->parts; p++)
        for (int b = 0; b < s->B; b++)
            memcpy(dst + ((size_t)p * s->B + b) * s->len, src + (size_t)b * s->T + cp_shard_pos(s, s->rank, p),
                   (size_t)s->len * sizeof(int));
}

int cp_pair_visible(const CPShard* s, int q0, int k0) { return k0 <= q0 + s->len - 1; }

long cp_pair_scores(const CPShard* s, int q0, int k0) {
    long n = 0;
    for (int i = 0; i < s->len; i++) {
        int v = q0 + i - k0 + 1;  // keys k0 .. q0+i of the part
        n += v < 0 ? 0 : (v > s->len ? s->len : v);
    }
    return n;
}

void ring_forward_begin(RingForward* f) { f->started[0] = f->started[1] = 0; }

void ring_forward_block(const CPShard* me, RingForward* f, const float* qkv, const float* kv, int src,
                        float* atty, float* rowmax, int C, int NH) {
    // EXERCISE 2: the block in hand: for each (my query part, src's key part) pair skip it if fully masked, else write (first pair of a query part) or merge its partials
    const int B = me->B, L = me->len;
    const size_t part_rows = (size_t)B * L;  // rows of one part
    for (int qp = 0; qp < me->parts; qp++)
        for (int kp = 0; kp < me->parts; kp++) {
            int q0 = cp_shard_pos(me, me->rank, qp), k0 = cp_shard_pos(me, src, kp);
            if (!cp_pair_visible(me, q0, k0)) {  // every key in every query's future
                f->skipped++;
                continue;
            }
            f->scores += cp_pair_scores(me, q0, k0);
            const float* q = qkv + qp * part_rows * 3 * C;  // queries: stride 3C inside qkv
            const float* k = kv + kp * part_rows * 2 * C;   // keys and values: stride 2C, packed
            float* o = atty + qp * part_rows * C;
            float* mx = rowmax + qp * part_rows * NH;
            float* l = f->sumexp + qp * part_rows * NH;
            if (!f->started[qp]) {
                attention_chunk_forward(o, mx, l, q, 3 * C, k, k + C, 2 * C, B, L, L, q0, k0, C, NH);
                f->started[qp] = 1;
            } else {
                attention_chunk_forward(f->o2, f->m2, f->l2, q, 3 * C, k, k + C, 2 * C, B, L, L, q0, k0, C, NH);
                attention_chunk_merge(o, mx, l, f->o2, f->m2, f->l2, B, L, C, NH);
            }
        }
    // END EXERCISE 2
}

void ring_forward_finish(const CPShard* me, RingForward* f, float* atty, float* lse, int C, int NH) {
    const size_t part_rows = (size_t)me->B * me->len;
    for (int qp = 0; qp < me->parts; qp++)
        attention_chunk_finish(atty + qp * part_rows * C, lse + qp * part_rows * NH, lse + qp * part_rows * NH,
                               f->sumexp + qp * part_rows * NH, me->B, me->len, C, NH);
}

void ring_backward_block(const CPShard* me, const float* qkv, const float* atty, const float* lse,
                         const float* datty, const float* kv, int src, float* dqkv, float* dkv, int C,
                         int NH) {
    const int B = me->B, L = me->len;
    const size_t part_rows = (size_t)B * L;
    for (int qp = 0; qp < me->parts; qp++)
        for (int kp = 0; kp < me->parts; kp++) {
            int q0 = cp_shard_pos(me, me->rank, qp), k0 = cp_shard_pos(me, src, kp);
            if (!cp_pair_visible(me, q0, k0)) continue;
            size_t qo = qp * part_rows, ko = kp * part_rows;
            attention_chunk_backward(dqkv + qo * 3 * C, dkv + ko * 2 * C, dkv + ko * 2 * C + C, datty + qo * C,
                                     atty + qo * C, lse + qo * NH, qkv + qo * 3 * C, 3 * C, kv + ko * 2 * C,
                                     kv + ko * 2 * C + C, 2 * C, B, L, L, q0, k0, C, NH);
        }
}

void cp_shard_encoder_forward(const CPShard* s, float* out, const int* inputs, const float* wte, const float* wpe,
                              int C) {
    for (int p = 0; p < s->parts; p++) {
        size_t r0 = (size_t)p * s->B * s->len;
        encoder_forward(out + r0 * C, inputs + r0, wte, wpe + (size_t)cp_shard_pos(s, s->rank, p) * C, s->B, s->len, C);
    }
}

void cp_shard_encoder_backward(const CPShard* s, float* dwte, float* dwpe, const float* dout, const int* inputs,
                               int C) {
    for (int p = 0; p < s->parts; p++) {
        size_t r0 = (size_t)p * s->B * s->len;
        encoder_backward(dwte, dwpe + (size_t)cp_shard_pos(s, s->rank, p) * C, dout + r0 * C, inputs + r0, s->B,
                         s->len, C);
    }
}

void cp_shard_regroup(const CPShard* s, int tp, float* dst, const float* src, int C, int to_group) {
    const size_t blk = (size_t)s->B * s->len * C;
    for (int r = 0; r < tp; r++)
        for (int p = 0; p < s->parts; p++) {
            size_t mine = ((size_t)r * s->parts + p) * blk, group = ((size_t)p * tp + r) * blk;
            ops_copy(dst + (to_group ? group : mine), src + (to_group ? mine : group), blk);
        }
}
