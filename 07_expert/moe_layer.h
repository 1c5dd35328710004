// moe_layer.h: the mixture-of-experts layer with its experts sharded over ep
// ranks (chapter 7's engine, linked by the capstone and by tests/test_moe.c).
//
// One MoE layer on a rank's N token rows, forward (moe_layer_forward):
//   1. route      router logits -> softmax -> top-k experts and gates
//   2. count      the load-balancing loss and the capacity over the GLOBAL
//                 batch (so every mesh trains one objective), then the plan:
//                 how many rows go to each expert, so to each ep rank, and
//                 the counts' exchange (an all-to-all of ints)
//   3. dispatch   my rows gathered in destination order, all-to-all-v'd
//   4. experts    the received rows, grouped by expert, through each expert
//   5. combine    the outputs all-to-all-v'd back, summed with the gates
// 3-5 go in chunks of the tokens (--ep-overlap n), pipelined; backward
// (moe_layer_backward) runs the two exchanges reversed, in the same chunks.
// Every collective of expert parallelism is in moe_layer.c, in that order.
//
// What the layer does not own, its caller passes in: the router's and this
// rank's experts' weights and gradients (wherever they live: a flat buffer,
// a ZeRO unit), the layer's input ln2 and its output.
#ifndef MOE_LAYER_H
#define MOE_LAYER_H

#include "comm.h"
#include "device_clock.h"
#include "model.h"
#include "moe.h"
#include "report.h"
#include "train_loop.h"

// What forward keeps of one MoE layer for backward: the routing, the plan of
// the two exchanges, and the rows on both sides. With --ep-overlap n the
// exchanges go in n chunks of the layer's tokens (chunk c: tokens
// [c N / n, (c + 1) N / n)), so the plan is per chunk.
//   send order     my kept slots by (chunk, expert, token): each chunk's
//                  rows are contiguous and in destination order
//   receive order  by (chunk, source rank, my expert, token)
//   experts' order by (my expert, source rank, chunk, token): each expert's
//                  rows contiguous, and for any n the order n = 1 gives, so
//                  the experts' weight gradients sum their rows in the same
//                  order whatever n (the same bits)
// A block (chunk c, source s, expert le) is contiguous in both of the last
// two orders: moving it between them is a copy.
typedef struct {
    float *logits, *probs, *gates;  // (N, E), (N, E), (N, k)
    int *idx, *pos;                 // (N, k) chosen experts; row of (t, j) in send (-1: dropped)
    int* send_src;                  // (N*k) token of each send row
    float *send, *back;             // (N*k, C) my rows out, the expert outputs back (send order)
    float *exp_in, *fch, *fch_gelu; // (R, C), (R, H), (R, H) in the experts' order
    float* aux_dprobs;              // (E) d objective / d each prob (load-balancing loss)
    // the plan, on the host (integers: plain MPI, the comm layer's collectives
    // are float-only); the first three are staging buffers (memory.h)
    int *idx_host, *pos_host, *src_host;
    int* cnt_send;                  // (E) my kept slots of each expert
    int* cnt_chunk;                 // (n, E) of them, per chunk
    int* cnt_recv;                  // (ep, n, E/ep) rows from source s in chunk c for my expert le
    int* send_row;                  // (n + 1) each chunk's first row in send order
    int *blk_recv, *blk_row;        // (n, ep, E/ep) block (c, s, le)'s first row: receive / experts' order
    int* expert_off;                // (E/ep + 1) each of my experts' rows in the experts' order
    size_t *sc, *sd, *rc, *rd;      // (n, ep) floats sent to / received from each ep rank per chunk
    int n_send, n_recv;
} MoeLayer;

// How a rank's MoE layers are set up.
typedef struct {
    MoeConfig cfg;          // the layers' model (a pipeline chunk's own: moe_layer_index counts from its first)
    int N;                  // token rows on this rank
    const Comm* epc;        // the all-to-all group: rank r holds experts [r E/ep, (r+1) E/ep)
    const Comm* batch;      // every rank that holds its own tokens of the global batch (the global sums)
    int chunks;             // --ep-overlap
    float aux_coef;         // the load-balancing loss's weight
    float capacity_factor;  // 0: dropless
    // capacity keeps the first slots in the global batch's order: the batch
    // is cut into n_blocks blocks (runs of positions of one sequence), and
    // row_block[t] is the block of my row t, in that order (N ints; copied);
    // my rows come in runs of block_len, one block each (so row t is token
    // row_block[t] block_len + t % block_len: the routing signature's)
    int n_blocks, block_len;
    const int* row_block;
    RecomputeMode recompute;  // selective: the layers share send and fch_gelu (moe_layer_recompute)
} MoeSpec;

// A rank's MoE layers: the settings, the scratch they share, the exchanges
// in flight and the step's statistics.
typedef struct {
    MoeConfig cfg;
    int N, ep, E_local, e0;  // my experts: [e0, e0 + E_local)
    int R;                   // most rows my experts can receive in one layer
    int chunks;
    const Comm *epc, *batch;
    float aux_coef, capacity_factor;
    int n_blocks, block_len;
    int* row_block;
    RecomputeMode recompute;
    WeightGradHook wgrad;  // model.h's: the capstone's zero-bubble W queues them (fn NULL: at once)
    // scratch shared by the layers (R rows on the experts' side, N k on mine)
    float *recv, *xbuf, *ybuf, *dfch, *dfch_gelu, *dsend, *dgates, *dlogits;
    float *send_shared, *gelu_shared;  // --recompute selective: every layer's send and fch_gelu
    float *probs_host, *aux_host;      // host staging (memory.h): a layer's probs (N, E), its balance gradient (E)
    // the exchanges of one layer in flight: dispatch chunk c is request c,
    // combine chunk c is chunks + c. Timed on the device's clock (on CUDA
    // comm_wait returns at once): request i's flight is a span of
    // a2a_flight[i] (one clock each: the chunks' spans overlap), the waits
    // alone spans of a2a_blocked_clock (comm_wait_clock_begin)
    CommRequest* a2a;
    DeviceClock* a2a_flight;
    DeviceClock a2a_blocked_clock;
    // statistics of the last forward, summed over the MoE layers (global):
    // kept when record is 1 (a training step's forward)
    int record;
    double aux;       // the load-balancing loss (without aux_coef)
    long dropped;     // token-slots dropped by capacity
    long* routed;     // (L_moe, E) token-slots routed to each expert
    uint64_t routing; // my token-slots' part of the routing signature (moe_step_routing)
    size_t token0;    // the forward's first token in the step's batch (the capstone's microbatch mb: mb B/m T)
    long dropped_total;
    // seconds blocked in the exchanges' waits and in flight (start to the
    // end of the wait): this step's (read from the clocks by
    // moe_step_record), and over the timed steps
    double a2a_blocked_s, a2a_inflight_s, a2a_blocked_timed, a2a_inflight_timed;
} MoeParallel;

void moe_parallel_create(MoeParallel* X, const MoeSpec* spec);
void moe_parallel_free(MoeParallel* X);
// n layers' kept state (one per MoE layer; --recompute full: one for all)
MoeLayer* moe_layers_create(const MoeParallel* X, int n);
void moe_layers_free(const MoeParallel* X, MoeLayer* layers, int n);

// A training step's forward starts: its statistics from zero.
void moe_step_begin(MoeParallel* X);

// Layer l (a layer of X->cfg that is MoE): out (N, C) = the sum over each
// token's kept slots of gate x expert(ln2 row). router (E, C); experts:
// this rank's E/ep experts of this layer (moe_expert_at's layout).
void moe_layer_forward(MoeParallel* X, MoeLayer* L, int l, const float* ln2, const float* router, float* experts,
                       float* out);
// Its backward from dout (N, C), d of out: the router's and my experts'
// gradients accumulate into drouter and dexperts (or go to X->wgrad);
// dln2 (N, C) = d ln2, overwritten.
void moe_layer_backward(MoeParallel* X, MoeLayer* L, int l, const float* dout, const float* ln2, const float* router,
                        float* drouter, float* experts, float* dexperts, float* dln2);
// --recompute selective, before layer l's backward: gelu(fch) of the
// experts' rows again (the layers share fch_gelu). Nothing crosses the network.
void moe_layer_recompute(MoeParallel* X, MoeLayer* L);

// Chunk c's first token of the N (c = chunks: N).
int moe_chunk_start(const MoeParallel* X, int c);

// After a training step: its routing statistics into the step record's
// fields (aux_loss, dropped, expert_tokens per MoE layer and expert, over
// the global batch, and routing: moe_step_routing's; NULL: a caller that
// records them itself; collective with fields), the exchanges' seconds.
void moe_step_record(MoeParallel* X, const TrainLoop* loop, int step, JsonBuf* fields);
// The step's routing signature over X->batch: a hash of each token-slot's
// (layer, token, expert, kept) summed mod 2^64, so the same on any mesh that
// routes alike, and changed when two tokens trade experts (the counts are not).
uint64_t moe_step_routing(const MoeParallel* X);
// After training: the all-to-all traffic per step (the mean over the ranks
// of over, every rank that trains), the dropped slots, the share of the
// exchanges' time compute hid, printed and added to the summary. Collective over over.
void moe_report(const MoeParallel* X, const Comm* over, const TrainLoop* loop, JsonBuf* extra);

#endif
