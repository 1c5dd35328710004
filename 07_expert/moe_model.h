// moe_model.h: chapter 7's model on one rank of the dp x ep mesh: its flags,
// its buffers (the replicated parameters, this rank's experts, their
// gradients and AdamW moments, the activations), the embedding and the head,
// validation, --sample, the MoE file (--model, --save), the training-state
// checkpoint's slices (--ckpt-dir, --resume) and --show-sharding.
//
// The strategy is not here: the step (the blocks, the MoE layer's exchanges
// through moe_layer.h, the two gradient groups) is 07_expert/main.c's.
#ifndef MOE_MODEL_H
#define MOE_MODEL_H

#include "args.h"
#include "ckpt.h"
#include "comm.h"
#include "moe.h"
#include "moe_layer.h"
#include "run.h"
#include "train_eval.h"
#include "train_loop.h"

// Chapter 7's own flags, as parsed (hidden 0: 4C; capacity 0: dropless).
typedef struct {
    int experts, top_k, hidden, moe_every, ep_overlap;
    float aux_coef, capacity;
} MoeFlags;

typedef struct {
    MoeConfig cfg;
    int B, T, N;        // my sequences of the global batch, their positions, B*T token rows
    int share;          // my sequences: [share B, (share + 1) B)
    int ep, E_local, e0;
    Comm batch;         // dp x ep: every rank, each with its own sequences (the replicated parameters' copies)
    const Comm *world, *dp, *epc;  // dp: the copies of my experts
    size_t n_shared, n_experts;
    float *shared, *dshared, *m_s, *v_s;     // moe.h's two buffers, their gradients, AdamW moments
    float *experts, *dexperts, *m_e, *v_e;
    GPTActs acts;       // the GPT's activations (the attention halves, the dense MLPs, the head)
    RecomputeMode recompute;
    MoeParallel moe;    // the MoE layers over ep (moe_layer.h)
    MoeLayer* layers;   // each MoE layer's kept state (--recompute full: one for all)
    float* dln2;        // (N, C) an MoE layer's d ln2
    int* rows_host;     // (2, N) host staging: my inputs then targets
} MoeModel;

// The seven flags above as the rows of a flag table (args.h), with their
// defaults set in *flags; and --model FILE read as an MoE file. The capstone
// adds them to its own.
#define MOE_NUM_FLAGS 7
void moe_flags_specs(MoeFlags* flags, ArgSpec out[MOE_NUM_FLAGS]);
// The model's config from the flags or --model FILE's header (the file wins;
// *flags updated to it), and the checks that do not depend on how the mesh
// splits the batch (the config, the experts' memory, the capacity of a
// forward of batch / microbatches, the balance coefficient, the mesh against
// the experts). Bad input ends every rank with one message.
MoeConfig moe_config_checked(const Run* run, MoeFlags* flags, int microbatches);
// The MoE model's tensors in a training-state checkpoint (moe.h's table, or
// the dense GPT's at E = 1), and the routing settings that change the
// trained model mixed into the run identity (ckpt_add_identity).
void moe_ckpt_model(Ckpt* ck, const MoeConfig* cfg, float capacity_factor, float aux_coef);
// The MoE file (moe.h, cfg at tp = 1) through a rank's checkpoint slices
// (ckpt.h), one code for every mesh of chapter 7 and the capstone. --model:
// the replicated floats and experts [e0, e0 + n) read, the parameters of
// `need` copied from them. --save: each float from the `own` slice holding
// it, into world rank 0's file over the init (seed: the dense form's router,
// in no checkpoint, is its init, as on a resume). Collective.
void moe_model_read_slices(const char* path, const MoeConfig* cfg, int e0, int n, const CkptList* need);
void moe_model_save_slices(const char* path, const MoeConfig* cfg, const Comm* world, const CkptList* own,
                           uint64_t seed);

// The chapter's flags and run_start (the shared flags, the dp x ep mesh);
// --model FILE is read as an MoE file. 0: end at once (--help).
int moe_model_run_start(Run* run, MoeFlags* flags, int argc, char** argv);
// The model's config after run_start: the flags, or --model FILE's experts,
// router and widths (*flags updated to them), checked against the mesh and
// the batch. Bad input ends every rank with one message.
MoeConfig moe_model_config(const Run* run, MoeFlags* flags);

// This rank's model: B / (dp ep) sequences of each global batch, experts
// [e0, e0 + E/ep), every buffer allocated, the parameters initialised
// (counter-based, moe.h) or read from --model FILE; the start-up lines.
void moe_model_create(MoeModel* m, const MoeConfig* cfg, const MoeFlags* flags, const Run* run);
void moe_model_free(MoeModel* m);
// The start-up's first two lines: the experts over dp x ep, and the model's
// `total` parameters (the replicated ones and the experts'), the batch.
void moe_print_setup(const MoeConfig* c, int ndp, int nep, int E_local, float capacity_factor, size_t total,
                     int per_rank, const Run* run);

// Layer l's parameters and gradients in the replicated buffer; MoE layer l's
// router (E, C), its gradient, and this rank's experts of it (and gradients).
BlockParams moe_model_block(MoeModel* m, float* buffer, int l);
float* moe_model_router(MoeModel* m, float* buffer, int l);
float* moe_model_experts(MoeModel* m, float* buffer, int l);
// Where MoE layer l's state lives in moe's layers (--recompute full: one for
// all), and where layer l's forward writes its attention half (the kept
// fields in its store, the dropped in the transient).
MoeLayer* moe_model_layer(const MoeParallel* moe, MoeLayer* layers, int l);
BlockActs moe_model_block_acts(MoeModel* m, int l);

// The parts that work token by token on my B x T tokens: the token ids to
// the device and the embeddings; the final LayerNorm, LM head and loss
// (returns my mean); its backward into acts.dres; the embeddings' backward.
void moe_model_embed_forward(MoeModel* m, const int* inputs, const int* targets);
float moe_model_head_forward(MoeModel* m);
void moe_model_head_backward(MoeModel* m);
void moe_model_embed_backward(MoeModel* m);

// My sequences of global batch `step` of d, (B, T) into inputs and targets.
void moe_model_load(const MoeModel* m, const TokenSet* d, long step, int* inputs, int* targets);
// Validation: the loop's val_loss with the chapter's forward (statistics not
// recorded): every rank its own sequences, the mean over dp x ep.
typedef float (*MoeForward)(MoeModel* m, const int* inputs, const int* targets);
float moe_model_val_loss(MoeModel* m, MoeForward forward, const TrainSetup* s, int n_batches);
// After training: --sample (every rank runs each forward: the all-to-alls
// meet) and --save (the MoE file). Collective.
void moe_model_finish(MoeModel* m, const TrainArgs* args, MoeForward forward);

// --ckpt-dir, --resume: ckpt_init for chapter 7, this rank's slices in the
// MoE model's global tensors (any dp x ep mesh resumes), the resume.
void moe_model_ckpt_open(Ckpt* ck, MoeModel* m, const Run* run);
// After training: the summary's MoE fields (zero: the ZeRO stage, the capstone's) and the exchanges' figures (moe_report's).
void moe_model_report(const MoeConfig* cfg, const MoeFlags* fl, int zero, const MoeParallel* moe, const Comm* over,
                      const TrainLoop* loop, JsonBuf* summary);

#endif
