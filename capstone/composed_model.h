// composed_model.h: chapter 7's mixture-of-experts model on one rank of the
// dp x tp x cp x ep mesh: its buffers (the replicated parameters, this rank's experts,
// their gradients and AdamW moments, the activations each MoE layer keeps),
// their creation and release, the MoE file (--model FILE, --save FILE) and
// the training-state checkpoint's slices (--ckpt-dir, --resume).
//
// The strategy is not here: routing, the exchange plan, the pipeline of
// dispatch, experts and combine, and the two gradient groups are the
// chapter's own, in capstone/main.c, in the order a step runs them. Here
// are its bookkeeping: the flags, the send order of the plan, which rows of
// a chunk run through which expert in which order, the exchanges' timing.
// The model's layout, init and block pieces are moe.h's.
#ifndef COMPOSED_MODEL_H
#define COMPOSED_MODEL_H

#include "ckpt.h"
#include "comm.h"
#include "context.h"  // chapter 6's CPMode, CPBalance, cp_parse_flags
#include "composed_zero.h"  // --zero: ZeroBuf
#include "moe.h"
#include "ring.h"     // chapter 6's CPShard and ring attention's compute
#include "run.h"
#include "train_eval.h"
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
    // the plan, on the host: counts are integers, and the comm layer's
    // collectives are float-only, so they travel by plain MPI; the first
    // three are staging buffers (memory.h), copied every step
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

// A split backward (--schedule zb; composed_wgrad.c): B computes what the
// stage before waits for, the input gradients, through every exchange of
// the layers (the MoE all-to-alls, the tp and cp collectives); the weight
// gradients of the big matmuls (attention's qkv and proj, a dense layer's fc
// and proj, the router, the experts' fc and proj) go into a queue, each with
// a copy of its input rows and output-gradient rows, and W runs the queue
// later, with no communication and nothing recomputed. Copies, not
// pointers: most of those rows sit in buffers the next layer reuses (the
// scratch, tp's gathered rows, what --recompute makes again). The small
// per-element weight gradients stay in B: the LayerNorms', the embeddings'
// and the tied head's.
typedef struct {
    float *dw, *db;     // the gradients it accumulates into (either may be NULL)
    float *dout, *inp;  // (N, OC), (N, C): the copies in the arena (inp NULL when dw is)
    int N, C, OC, layer;
} WGradEntry;

typedef struct {
    float* arena;  // (cap) the copies of one (microbatch, chunk)'s deferred matmuls
    size_t cap, used;
    WGradEntry* e;
    int n, max;
} WGradQueue;

// Context parallelism (--cp N): chapter 6's token layout and attention over
// the cp group, in every MoE layer's attention half. A cp rank holds T/cp
// positions of each of its B sequences (sh, ring.h: part-major rows); the
// rest of the layer is per token. Ring: each layer keeps its log-sum-exp
// (the ring's backward needs nothing else of the softmax); Ulysses: each
// layer keeps its head shard's q, k, v and probabilities over whole
// sequences. cp = 1: sh is every position, nothing else is allocated.
typedef struct {
    CPMode mode;
    CPShard sh;
    const Comm* cpc;                 // the ring / all-to-all group
    float* lse;                      // ring: (L, N, NH) each layer's
    float *kv[2], *dkv[2], *dkv_in;  // ring: (N, 2C) [k | v] blocks and dK|dV sums (chapter 6's)
    RingForward ring;                // ring: the running partials (ring.h)
    float *qkv_h, *att_h;            // ulysses: (L, B, T, 3C/cp), (L, B, NH/cp, T, T) each layer's
    float *send, *recv, *y_h, *dqkv_h, *datt_h;  // ulysses: (N, 3C) x 2, (N, C), (N, 3C), (B, NH/cp, T, T)
    float *dfch_gelu, *dfch;         // --moe-every > 1: a dense layer's MLP gradients, (N, 4C) each
} ExpertCP;

// Tensor parallelism with sequence parallelism (--tp N, composed_tp.c). A tp
// rank holds B/tp whole sequences of its share (its N token rows) through
// everything that works token by token: the embedding, the LayerNorms, the
// residuals, the router, the MoE layer (the experts whole, replicated over
// tp) and the head. Attention alone meets the tp group: its N tp rows are
// all-gathered, each rank runs its NH/tp heads (qkv column-parallel,
// attproj row-parallel) and a reduce-scatter brings its rows back.
// tp = 1: nothing here is allocated and sh is cp.sh.
typedef struct {
    int tp, rank;
    const Comm* tpc;         // the all-gather / reduce-scatter group
    const Comm* dpcpep;      // the copies of my slices: dp x cp x ep
    Comm dpcpep_own;
    CPShard sh;              // attention's layout: the tp group's B tp sequences (cp.sh: my B)
    size_t n;                // floats of my slices: L (4C^2 + 3C) / tp
    float *w, *dw, *m, *v;   // per layer qkvw (3C/tp, C) qkvb (3C/tp) attprojw (C, C/tp)
    float *full, *dfull;     // (N tp, C) every row of the group: a gathered LayerNorm output, a partial sum
} ExpertTP;

typedef struct {
    MoeConfig cfg;
    int B, T, N;           // this rank's sequences (B/tp of its share's), its positions of each (T/cp), B*T token rows
    int share;             // my sequences of the global batch: [share B, (share + 1) B)
    int ep, E_local, e0;   // ep ranks; my experts are [e0, e0 + E_local)
    int R;                 // most rows my experts can receive in one layer
    Comm batch;            // every rank that holds the replicated parameters: dp x cp x ep (x tp),
                           // each with its own tokens of the global batch
    const Comm *world, *dp, *epc;  // world: rank 0 writes the file
    const Comm* dpcp;      // the copies of my experts: dp x cp x tp (= dp when cp = tp = 1)
    Comm dpcp_own;         // that group, made when cp > 1 or tp > 1
    ExpertCP cp;
    ExpertTP tp;
    float aux_coef, capacity_factor;  // capacity_factor 0: dropless
    // parameters: the replicated ones and my experts (moe.h's two buffers)
    size_t n_shared, n_experts;
    float *shared, *dshared, *m_s, *v_s;
    float *experts, *dexperts, *m_e, *v_e;
    // --zero 1 (composed_zero.h): each buffer's moments sharded over the group
    // of its copies (batch, dpcp, tp.dpcpep); zero 0: every rank all of them
    // (the experts first: the norm sums them first, as without --zero);
    // --zero 2, 3: chapter 3's engine in each z holds the buffer, the flat
    // pointers above (and tp's) are NULL, and a layer finds its parameters
    // by unit (expert_block_params, expert_router, expert_zero_params)
    int zero, nz;  // nz: the buffers, 2, or 3 with --tp
    ZeroBuf z[3];  // [ZERO_EXPERTS], [ZERO_SHARED], [ZERO_TP]
    // activations: the GPT's (embedding, the blocks' attention halves and
    // dense MLPs as --recompute keeps them, head, scratch, dres, token ids)
    // and each MoE layer's own
    GPTActs acts;
    RecomputeMode recompute;
    MoeLayer* moe;  // one per MoE layer (--recompute full: one for all)
    float *send_shared, *gelu_shared;  // --recompute selective: every layer's send and fch_gelu
    // scratch shared by the layers
    float *recv, *xbuf, *ybuf, *dfch, *dfch_gelu, *dsend, *dgates, *dlogits, *dln2;
    // host staging buffers (memory.h), used every step: my rows' inputs then
    // targets (2, N) on their way to the device; a layer's router probs
    // (N, E) and its balance gradient (E), balance_loss's
    int* rows_host;
    float *probs_host, *aux_host;
    // statistics of the last forward, summed over the MoE layers (global)
    double aux;      // the load-balancing loss (without aux_coef)
    long dropped;    // token-slots dropped by capacity
    long* routed;    // (L_moe, E) token-slots routed to each expert
    long dropped_total;  // over the training steps so far
    int record;      // 1: this forward is a training step's (statistics kept)
    // --ep-overlap: chunks per MoE layer, and the dispatch (0 .. n-1) and
    // combine (n .. 2n-1) exchanges of one layer in flight, with when each
    // started; the seconds blocked in their waits and in flight (start to
    // the end of the wait) in this training step and over the timed steps
    int chunks;
    CommRequest* a2a;
    double* a2a_started;
    double a2a_blocked_s, a2a_inflight_s, a2a_blocked_timed, a2a_inflight_timed;
    // --pp (composed_pipe.c): this model is one pipeline chunk's layers; only
    // the first embeds the tokens (the others' input, acts.encoded, arrives
    // from the stage before) and only the last runs the head (the others'
    // acts.dres arrives from the stage after). 1 and 1 without --pp.
    int embeds, has_head;
    // --schedule zb (composed_wgrad.c): split 1; wq, while B runs on a slot,
    // that slot's queue (NULL: every weight gradient at once)
    int split;
    WGradQueue* wq;
} ExpertModel;

// Chapter 7's own flags, as parsed (hidden 0: 4C; capacity 0: dropless).
typedef struct {
    int experts, top_k, hidden, moe_every, ep_overlap;
    float aux_coef, capacity;
    const char *cp_mode_name, *cp_balance_name;  // --cp-mode, --cp-balance as given
    CPMode cp_mode;                              // parsed by expert_config
    CPBalance cp_balance;
    // --pp with chapter 5's schedules (composed_pipe.h); microbatches
    // ARG_NOT_GIVEN: pp (and no pipeline at pp = 1)
    const char* schedule;
    int microbatches, virtual_chunks;
    int zero;  // --zero: 0, 1 the AdamW moments sharded, 2 the gradients, 3 the parameters (composed_zero.h)
} ExpertFlags;

// The chapter's flags (the table is in composed_model.c) and run_start (the
// shared flags, the dp x cp x ep mesh); --model FILE is read as an MoE file.
// Returns 0 when the program should end at once (--help).
int expert_run_start(Run* run, ExpertFlags* flags, int argc, char** argv);

// The reader run_start uses for --model FILE (train_config_reader): the GPT
// part of an MoE file's header. A dense llm.c file is refused with the
// reason (it has no router and no experts).
const char* expert_read_gpt_config(const char* path, GPTConfig* cfg, char* msg, size_t len);

// The model's config after run_start: the flags, or with --model FILE the
// file's experts, router and widths (they win over the flags; *flags is
// updated to them). Checks the flags, and the mesh against the experts and
// the batch (every rank takes its own sequences); bad input ends every rank
// with one message.
MoeConfig expert_config(const Run* run, ExpertFlags* flags);

// This rank's model: its share of B/(dp ep) sequences of the global batch
// per step (T/cp positions of each), the experts [e0, e0 + E/ep) of its ep coordinate, every buffer
// allocated and counted, the parameters initialised (counter-based, moe.h)
// or read from --model FILE, statistics recorded.
void expert_model_create(ExpertModel* m, const MoeConfig* cfg, const ExpertFlags* flags, const Run* run);
// The same for a pipeline chunk (composed_stage.c): embeds and has_head as the
// fields say; without the head the activations have no logits.
void expert_model_create_part(ExpertModel* m, const MoeConfig* cfg, const ExpertFlags* flags, const Run* run,
                              int embeds, int has_head);
// The start-up lines: the mesh, the experts, the parameters.
void expert_print_setup(const ExpertModel* m, const Run* run);
void expert_model_free(ExpertModel* m);
// n MoE layers' state for m->N token rows (one layer each, as
// expert_model_create makes m->moe), and its release: a pipeline stage keeps
// one set per microbatch in flight (composed_pipe.c).
MoeLayer* expert_moe_layers_create(const ExpertModel* m, int n);
void expert_moe_layers_free(const ExpertModel* m, MoeLayer* layers, int n);

// Where MoE layer l's state lives (--recompute full: one for all layers).
MoeLayer* expert_layer(ExpertModel* m, int l);
// Where layer l's forward writes its attention half (and a dense layer its
// MLP): the kept fields in the layer's store, the dropped ones in the
// transient (model.h, --recompute).
BlockActs expert_block_acts(ExpertModel* m, int l);
// The parts of the step that work token by token on this rank's B x T
// tokens: the token ids to the device and their embeddings; the final
// LayerNorm, LM head and loss (returns their mean); its backward into
// acts.dres; the embeddings' backward from acts.dres. In a pipeline chunk
// without the embedding (m->embeds 0) the first only loads the tokens and
// the last does nothing; without the head (m->has_head 0) the head's
// forward returns 0 and its backward does nothing.
void expert_embed_forward(ExpertModel* m, const int* inputs, const int* targets);
float expert_head_forward(ExpertModel* m);
void expert_head_backward(ExpertModel* m);
void expert_embed_backward(ExpertModel* m);
// --zero 2, 3 (composed_zero.h), layer l's units in the three buffers (its
// piece of the replicated buffer, its experts, its tp slices; l = -1 the
// embedding's [wte wpe], l = L the head's [lnfw lnfb] and wte). gather:
// --zero 3 all-gathers them over their groups (l = -1 first forgets the last
// step's). open, before the layer's backward: gathered again, and their
// gradient buffers zeroed (l = L opens wte's too, which -1 closes). reduce,
// after it: each gradient reduce-scattered over its group. Nothing at lower
// stages.
void expert_units_gather(ExpertModel* m, int l);
void expert_units_open(ExpertModel* m, int l);
void expert_units_reduce(ExpertModel* m, int l);
// Layer l's router (E, C) and its gradient.
float* expert_router(ExpertModel* m, int l);
float* expert_router_grad(ExpertModel* m, int l);
// The exchanges of the MoE layers (dispatch: chunk c is request c; combine:
// chunks + c): a non-blocking all-to-all-v over ep, and its wait, which
// adds the seconds blocked and in flight to the step's figures.
void expert_a2a_start(ExpertModel* m, int i, const float* send, const size_t* sc, const size_t* sd, float* recv,
                      const size_t* rc, const size_t* rd);
void expert_a2a_wait(ExpertModel* m, int i);
// Chunk c's first token of a rank's N (c = chunks: N).
int expert_chunk_start(const ExpertModel* m, int c);
// The plan's send order, from the kept slots (L->pos_host >= 0) and their
// experts (L->idx_host): per chunk and expert the slots kept (cnt_chunk),
// each chunk's first send row (send_row, n_send), and every kept slot's row
// (pos_host) and every row's token (src_host).
void expert_plan_send_order(ExpertModel* m, MoeLayer* L);
// The experts on chunk c of MoE layer l, block by block (source, expert):
// forward, each block's received rows (m->recv, receive order) copied into
// exp_in in the experts' order, its fch and fch_gelu kept there, its
// outputs into m->xbuf in the receive order (what the combine sends back);
// backward's input half, the row gradients (m->recv) copied into m->xbuf in
// the experts' order (kept for the weights) and d of the inputs into
// m->ybuf in the receive order, dfch kept in m->dfch. Rows are independent
// in both, so chunk by chunk is the same bits as all at once.
void expert_blocks_forward(ExpertModel* m, MoeLayer* L, int l, int c);
void expert_blocks_backward_input(ExpertModel* m, MoeLayer* L, int l, int c);
// The weight half of backward: each expert over all its rows, in the
// experts' order (the order n = 1 gives for any n).
void expert_blocks_backward_weights(ExpertModel* m, MoeLayer* L, int l);
// The split backward (composed_wgrad.c). expert_wgrad_enable: a chunk of a
// split schedule (a dense layer then takes chapter 7's own backward at
// cp = tp = 1 too, composed_cp.c, with its (N, 4C) MLP gradients). The
// arena's floats per (microbatch, chunk): every deferred matmul's copies,
// the experts' at their most rows R; a queue of them, and its release.
// expert_wgrad: dw (OC, C) += dout^T inp, db (OC) += the rows' sum of dout
// (matmul_backward's weight half), at once, or with m->wq set copied into
// its arena and queued; expert_wgrad_run runs a queue in the order it was
// filled (a "block l backward weights" span per layer) and empties it.
void expert_wgrad_enable(ExpertModel* m);
size_t expert_wgrad_floats(const ExpertModel* m);
void expert_wgrad_create(WGradQueue* q, const ExpertModel* m);
void expert_wgrad_free(WGradQueue* q);
void expert_wgrad(ExpertModel* m, int layer, float* dw, float* db, const float* dout, const float* inp, int N, int C,
                  int OC);
void expert_wgrad_run(WGradQueue* q);
// The attention half of layer l (ln1 to ln2, moe.h) on my N rows: at cp = 1
// moe_attention_forward itself; at cp > 1 its two halves around the cp
// group's attention (--cp-mode ring: the K/V blocks around the ring;
// ulysses: all-to-all to head shards and back), chapter 6's algorithms on
// ring.c's compute (composed_cp.c). Backward likewise, with dln2 and dres as
// moe_attention_backward takes them.
void expert_attention_forward(ExpertModel* m, int l, const BlockParams* p, BlockActs* a, const float* x);
void expert_attention_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g, const BlockActs* a,
                               const BlockScratch* s, const float* x, const float* dln2, float* dres);
// --recompute selective, before layer l's backward: the attention
// probabilities its backward reads, again from the kept q, k, v into a
// (cp = 1: model.h's att; Ulysses: the head shard's; the ring keeps none).
void expert_attention_recompute(ExpertModel* m, int l, BlockActs* a);
// A dense layer (--moe-every > 1): model.h's gpt_block_forward and
// gpt_block_backward at cp = tp = 1; at cp > 1 or tp > 1 the attention half
// above and the dense MLP on my rows (backward: acts.dres from d res3 to d
// x; with a split backward at cp = tp = 1 too, its weights queued).
void expert_dense_forward(ExpertModel* m, int l, const BlockParams* p);
void expert_dense_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g);
// Layer l's parameters (or gradients) as a BlockParams: the shared buffer's
// tensors and, with --tp, this rank's slices of qkvw, qkvb and attprojw.
BlockParams expert_block_params(ExpertModel* m, int l);
BlockParams expert_block_grads(ExpertModel* m, int l);
// Attention itself on the attention's rows (the tp group's, this rank's
// NH/tp heads): a->qkv to a->atty, at cp = 1 chapter 0's op, at cp > 1 the
// ring or Ulysses over cp (composed_cp.c); backward s->datty to s->dqkv.
void expert_attention_core_forward(ExpertModel* m, int l, BlockActs* a);
void expert_attention_core_backward(ExpertModel* m, int l, const BlockActs* a, const BlockScratch* s);
// --tp (composed_tp.c): the attention half on my N rows around the tp
// group's attention; the slices' buffers, from the whole model's values
// (host, moe.h's layout at tp = 1) split into the shared buffer's layout
// and my slices, and back for --save; the checkpoint's and the sharding
// table's lines of the slices.
void expert_tp_attention_forward(ExpertModel* m, int l, const BlockParams* p, BlockActs* a, const float* x);
void expert_tp_attention_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g, const BlockActs* a,
                                  const BlockScratch* s, const float* x, const float* dln2, float* dres);
void expert_tp_create(ExpertModel* m, const Run* run);
void expert_tp_init(ExpertModel* m, uint64_t seed);  // my slices' counter-based init
void expert_tp_load(ExpertModel* m, const float* whole);  // whole: moe_num_shared at tp = 1 (host)
void expert_tp_free(ExpertModel* m);
// The whole model's shared buffer (host, tp = 1 layout) on tp rank 0 from
// every rank's; collective over tp. NULL on the other ranks.
float* expert_tp_gather_whole(ExpertModel* m);
// The cp rank that holds position pos of a sequence (ring.h's layout), and
// pos's row there in the first of its sequences (--sample reads its logits).
int expert_cp_owner(const CPShard* sh, int pos, size_t* row);
// The cp buffers of m (m->N, m->cfg and m->cp.sh set), and their release.
void expert_cp_create(ExpertModel* m);
void expert_cp_free(ExpertModel* m);
// All parameters, the replicated ones and every expert of every MoE layer.
size_t expert_total_params(const ExpertModel* m);

// --sample N: generated by every rank's forward(m, inputs, targets) (the
// chapter's, on this rank's B x T tokens, statistics not recorded), rank 0
// sampling and printing. Collective.
void expert_sample(ExpertModel* m, const TrainArgs* args, TrainForward forward);

// --save FILE: the MoE file (moe.h), written by world rank 0 from the
// replicated parameters and every expert gathered over ep. Collective.
void expert_model_save(ExpertModel* m, const char* path);

// After training step `step`: its routing statistics (aux_loss, dropped,
// expert_tokens per MoE layer and expert, over the global batch) into the
// step record's fields (loop->step_extra), dropped into dropped_total, and
// the exchanges' blocked and in-flight seconds into the timed totals when
// the loop's clock timed the step.
void expert_step_record(ExpertModel* m, TrainLoop* loop, int step);
// After training: prints the all-to-all traffic per step (the mean over the
// ranks), the dropped slots and the share of the exchanges' time in flight
// that compute hid, and adds the chapter's summary fields (the MoE's shape,
// the traffic, dropped_total, a2a_hidden_share). Collective.
void expert_report(const ExpertModel* m, const ExpertFlags* flags, const TrainLoop* loop, JsonBuf* extra);

// The training-state checkpoint's lists (ckpt.h): what this rank writes
// (dp replica 0 writes the experts, each ep rank its own, and 1/ep of the
// replicated state each) and reads (all the replicated state, its own
// experts), in the MoE model's global tensors, so any dp x ep mesh resumes.
void expert_model_ckpt(Ckpt* ck, ExpertModel* m);
// The chapter's settings that change the trained model (--capacity-factor,
// --aux-coef), mixed into the checkpoints' run identity (ckpt_add_identity).
void expert_ckpt_identity(Ckpt* ck, const ExpertModel* m);
// --ckpt-dir, --save-every, --resume: ckpt_init for chapter 7, this rank's
// lists (expert_model_ckpt), then the resume, from whatever mesh saved it.
void expert_ckpt_open(Ckpt* ck, ExpertModel* m, const Run* run);

// --show-sharding: the replicated parameters (the GPT and the routers) on
// every rank, this rank's E/ep experts of every MoE layer (sharding.h).
// Collective when show is set.
void expert_model_show_sharding(const ExpertModel* m, int show);

#endif
