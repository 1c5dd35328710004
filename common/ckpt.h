// ckpt.h: training-state checkpoints, sharded, atomic, asynchronous and
// resumable on another chapter and mesh (docs/checkpoints.md).
//
// A training state is the parameters, both AdamW moments, the step (which is
// also the data position: batch s starts at sequence s*B) and the seed. On
// disk it is one directory per checkpoint,
//
//   DIR/step-00000006/rank-00000.bin ... rank-NNNNN.bin   what each rank owns
//   DIR/step-00000006/MANIFEST                             written last
//
// and the MANIFEST names every global tensor (params.qkvw, m.qkvw, v.qkvw,
// ... in llm.c's names and global shapes), which file holds which slice of
// it, and a checksum per file.
//
// A slice is a set of runs in the tensor's global index space (row-major,
// llm.c's shape, layers outermost): `count` runs of `len` floats, run k
// starting at element start + k*stride. A flat range is one run (count 1);
// a tensor-parallel tile, columns [c0, c0+w) of a (L, R, C) weight, is
// start c0, len w, stride C, count L*R; rows [r0, r1) of every layer of it
// are start r0*C, len (r1-r0)*C, stride R*C, count L. The slice's values sit
// contiguous in memory, run after run.
//
// A chapter lists what its rank owns (to save) and what it needs (to load),
// then calls ckpt_resume once and ckpt_after_step after every step:
//
//   Ckpt ck;
//   ckpt_init(&ck, args, setup, mesh, chapter);
//   ckpt_add_flat(&ck.own, cfg, CKPT_PARAMS, 0, P, params);   // what I write
//   ckpt_add_flat(&ck.need, cfg, CKPT_PARAMS, 0, P, params);  // what I read
//   int start = ckpt_resume(&ck);           // 0, or the checkpoint's step
//   for (step = start; step < steps; step++) { ...; ckpt_after_step(&ck, step); }
//   ckpt_finish(&ck, &log);                 // joins an async save, reports
//
// Loading is slice intersection: each needed run is cut against every saved
// slice of the same tensor, and the overlaps are read from whichever files
// hold them. Whatever mesh saved it, every element must be found once.
#ifndef CKPT_H
#define CKPT_H

#include <mpi.h>
#include <pthread.h>
#include <stddef.h>

#include "args.h"
#include "mesh.h"
#include "model.h"
#include "report.h"
#include "errors.h"

// train.h's (the model and batch a run resolved): ckpt_init reads its config
// and batch. Only named here, so the training-state layer does not include
// the training loop's header, which sits above it.
struct TrainSetup;

typedef enum { CKPT_PARAMS, CKPT_M, CKPT_V, CKPT_NUM_KINDS } CkptKind;

// count runs of len floats of tensor `tensor` (a ParamTensor) of kind `kind`,
// run k at global element start + k*stride; data: their values, contiguous
// (device memory: read by a save, written by a load).
typedef struct {
    int kind, tensor;
    size_t start, len, stride, count;
    float* data;
} CkptSlice;

typedef struct {
    CkptSlice* s;
    int n, cap;
    size_t floats;  // sum of len * count
} CkptList;

// A model that is not the GPT (chapter 7's mixture of experts) names its own
// tensors: CkptSlice.tensor indexes this table, each tensor's global index
// space is its dims, row-major. A dimension may be 0 (a tensor the model
// does not have, such as the dense MLP when every layer is MoE).
typedef struct {
    char name[32];
    int nd;  // 1..4
    size_t dims[4];
} CkptTensor;

// Appends a slice (stride is set to len when count is 1).
void ckpt_add(CkptList* l, CkptSlice s);
// Appends the flat layer-major range [lo, lo + n) of kind `kind` (model.h's
// layout: a replica, a ZeRO shard, a unit), whose values are at data: one
// slice per (tensor, layer) piece it overlaps.
void ckpt_add_flat(CkptList* l, const GPTConfig* cfg, CkptKind kind, size_t lo, size_t n, float* data);
// The same range of all three kinds at once: params, m and v (m and v may
// be NULL: a rank that keeps no AdamW state).
void ckpt_add_state(CkptList* l, const GPTConfig* cfg, size_t lo, size_t n, float* params, float* m, float* v);
void ckpt_list_free(CkptList* l);
// The resharding's slice arithmetic (ckpt_resume's, ckpt_whole.c's, tests/test_ckpt.c's): for each overlap
// of the runs of `need` with those of `saved` (a slice of the same tensor
// whose values sit in a file from byte `offset` on, run after run),
// fn(ctx, floats into need's data, byte in the file, floats). Returns the
// floats found.
typedef void (*CkptPieceFn)(void* ctx, size_t dst, size_t file_offset, size_t n);
size_t ckpt_intersect(const CkptSlice* need, const CkptSlice* saved, size_t offset, CkptPieceFn fn, void* ctx);
// A model held whole in memory as slices (ckpt_whole.c): a model file's
// values, --save's buffer. ckpt_copy: every overlap of a slice of `to`
// (device data) with one of `from` (host data) of the same kind and
// tensor, copied (--model FILE into a rank's need list). ckpt_gather: the
// slices of `kind` of every rank's `own` (device data) into rank 0's
// `whole` (host data; unread elsewhere). Each returns the floats copied
// (ckpt_gather: on rank 0, 0 elsewhere): to's or whole's floats when every
// element is found once. ckpt_gather is collective over comm.
size_t ckpt_copy(const CkptList* to, const CkptList* from);
size_t ckpt_gather(const CkptList* own, CkptKind kind, MPI_Comm comm, const CkptList* whole);

typedef struct Ckpt {  // named: train_loop.h's loop holds a pointer to one
    // settings: the flags, the model and the run
    const char* dir;   // --ckpt-dir (NULL: no saves)
    const char* resume;
    int every, keep, async, chapter;
    GPTConfig cfg;
    // NULL: the GPT's 16 tensors (ParamTensor). Else the model's own table
    // (ckpt_set_model), and `variant` names what GPTConfig does not say
    // ("moe experts=4 ..."): a checkpoint must have the same to be resumed.
    const CkptTensor* tensors;
    int n_tensors;
    char variant[256];
    int B, T, seed, steps;
    // the run's identity: a hash of what decides the model it trains (the
    // model, its variant, the --model file's bytes it starts from, seed,
    // batch, sequence, AdamW's settings and the training tokens), not of
    // the mesh or chapter, which train the same model
    unsigned long long run_id, data_hash;
    size_t data_tokens;
    int mesh[NUM_AXES];
    float lr, wd, clip;
    int world, rank;
    // what this rank writes and what it reads
    CkptList own, need;
    int start_step;  // the resumed step (0 without --resume)
    // the save in flight (async: written by the thread, committed later)
    int pending, pending_step;
    pthread_t thread;
    int thread_running;        // a writer thread to join
    volatile int thread_done;  // set by the thread when the file is on disk
    float* host;       // (own.floats) the state copied off the device
    size_t host_cap;
    size_t file_bytes;
    unsigned long long file_hash;
    char file_err[ERROR_MAX];  // empty when the write succeeded
    char file_path[4096];
    // a resumed run's last save on each level (the step it resumed until its
    // first): a step between it and the next save is another branch's, which
    // this run passed (ckpt_prune); -1 for a fresh run
    int last_saved, local_last_saved;
    // figures: saves, bytes, the time the training loop was stalled
    int saves;
    double stall_s;   // main thread inside ckpt calls for saves, in the training loop
    double finish_s;  // ckpt_finish waiting for the last save (nothing left to overlap)
    double write_s;   // the file writes themselves (in the thread when async)
    double load_s;
    size_t load_bytes;
    int lock_fd;  // rank 0: DIR/.lock, held (flock) from ckpt_init to ckpt_finish; -1 if none
    int local_lock_fd;  // each node's first rank: LOCAL/node-K/.lock, held alike; -1 if none
    // level 1 (--ckpt-local): the same files and manifest under
    // LOCAL/node-K/step-N, K this rank's node; level 2 (--ckpt-redundancy)
    // keeps them across nodes: a partner's copy, or an xor parity per group
    const char* local;
    int local_every, redundancy;  // redundancy: CKPT_REDUNDANCY_*
    int node, nodes, local_index;  // this rank's node, how many, its place among its node's ranks
    int* node_of;                  // (world) every rank's node
    int group_size, group_index;   // its group: the ranks of its local_index, one per node, by node
    MPI_Comm group;                // MPI_COMM_NULL without level 1
    int local_saves;
    double local_s;        // the level-1 saves, in the training loop (files, level 2, manifest)
    double redundancy_s;   // of which the level-2 exchange and write
    size_t redundancy_bytes;  // level-2 bytes this rank wrote per save (a partner's copy or its parity)
    // a step saved on both levels: level 3 is drained from level 1 (its file
    // copied, in the background) instead of written from c->host again
    int pending_drain;
    char drain_src[4096];                 // this rank's level-1 file of the step
    size_t local_file_bytes;              // its size and checksum, as level 1 wrote it
    unsigned long long local_file_hash;
    size_t serialised_bytes;  // bytes of rank files written from the state (c->host), every level
    size_t drained_bytes;     // bytes of level-3 files copied from level 1 instead
    int drains;
    // the level-1 resume: each node directory this rank read, a bit per node
    // (the first 64), and the bytes it sent to other ranks: xor pieces for
    // a rebuild, whole files to a rank whose node lacks them
    unsigned long long read_nodes;
    size_t rebuild_sent_bytes, fetch_sent_bytes;
    // --incremental K: level-3 saves between full ones (every K-th) hold the
    // xor with the last full save's state, compressed (zstd)
    int incremental, pending_delta;
    int base_step;                         // the last full save's step
    unsigned long long base_manifest_hash; // rank 0: its manifest's checksum
    float* base_host;                      // (own.floats) its state
    size_t delta_bytes, delta_bytes_total, full_bytes_total;
    unsigned long long delta_hash;
    int deltas;
    char delta_path[4096];
} Ckpt;

enum { CKPT_REDUNDANCY_NONE, CKPT_REDUNDANCY_PARTNER, CKPT_REDUNDANCY_XOR };

// Reads the checkpoint flags; no file is touched yet.
void ckpt_init(Ckpt* c, const TrainArgs* a, const struct TrainSetup* s, const Mesh* mesh, int chapter);
// For a model other than the GPT, before ckpt_resume: its tensor table
// (kept by pointer: it must outlive c) and its variant line.
void ckpt_set_model(Ckpt* c, const CkptTensor* tensors, int n, const char* variant);
// A chapter's own settings that change the model a run trains (chapter 7's
// --capacity-factor and --aux-coef), mixed into the run's identity like the
// shared ones, before ckpt_resume; the same text on every rank.
void ckpt_add_identity(Ckpt* c, const char* what);
// With --resume: finds the latest complete checkpoint (with --ckpt-local
// too, the newest step complete or rebuildable on level 1 or 3), checks its manifest
// against the model, the batch and the files' checksums, and fills every
// slice of c->need. Returns the step to start at (0 without --resume).
// Collective over the world; any problem ends every rank with a message
// naming the file.
int ckpt_resume(Ckpt* c);
// After step `step` (0-based) has updated the state: commits an async save
// that has finished, and saves when step + 1 is a multiple of --save-every
// or the last step (with --ckpt-dir). Collective over the world.
void ckpt_after_step(Ckpt* c, int step);
// Joins and commits a save in flight, prints and logs the figures.
// Collective. Frees the lists.
void ckpt_finish(Ckpt* c, JsonLog* log);

// The latest complete checkpoint under dir (dir itself if it holds a
// MANIFEST), written into out; NULL if there is none, else out.
const char* ckpt_latest(const char* dir, char* out, size_t out_len);

// Reads and checks DIR/MANIFEST against c's model (its checksum line, every
// line's syntax and range, the model, the tensors' shapes, the slices'
// bounds), without MPI and without opening the rank files: NULL, or the
// message a resume would give. What ckpt_resume runs first; the fuzz target
// tests/fuzz/fuzz_manifest.c feeds it any bytes.
const char* ckpt_check_manifest(const Ckpt* c, const char* dir, char* msg, size_t msg_len);

// The checksum of every checkpoint file and manifest: XXH3-64 from xxHash
// (Debian's libxxhash). A 64-bit hash mixes every input bit into every
// output bit, so any corruption (one flip, paired flips, swapped words or
// blocks) goes unseen with probability about 2^-64. It guards against
// accidents (bit rot, a torn or mixed-up file), not against someone who
// rewrites a file and its manifest on purpose: that needs a signature.
unsigned long long ckpt_checksum(const void* buf, size_t n);

#endif
