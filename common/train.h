// train.h: a run's set-up, the same in every chapter: the model and the
// batch resolved from the flags, the data opened and checked, the
// checkpoint's parameters read, and the mesh checked against the model.
// The rest of a run is in run.h (start and end), train_loop.h (the loop's
// bookkeeping), train_step.h (a step's work across ranks) and train_eval.h
// (validation, --sample, --save).
#ifndef TRAIN_H
#define TRAIN_H

#include "args.h"
#include "data.h"
#include "mesh.h"
#include "model.h"

typedef struct TrainSetup {  // named: ckpt.h takes a pointer to one
    GPTConfig cfg;
    const char* model_name;  // "tiny", "small" or the checkpoint's path
    const char* checkpoint;  // the path when --model is a file, else NULL
    int B, T;                // global batch (sequences) and sequence length
    TokenSet train, val;     // val.count == 0: no validation data
} TrainSetup;

// Every rank calls it. Resolves the model (a preset, or a checkpoint's header),
// the batch and sequence defaults, opens the data and checks that everything
// fits together (sequence <= the model's positions, tokens < vocabulary, one
// batch fits the data). On any problem, every rank exits non-zero after one
// clear message: it never returns half set up.
void train_setup(TrainSetup* s, const TrainArgs* a);
// Notes on rank 0 for flags the set-up leaves nothing to do: --val-every and
// --val-batches without validation data (a token file alone has no split).
void train_note_unused(int argc, char** argv, const TrainSetup* s);
// A chapter whose checkpoint file is not llm.c's (chapter 7's MoE file) sets
// this before run_start: train_setup then reads --model FILE's config with
// it instead of checkpoint_read_config (NULL or a message, as that one).
typedef const char* (*TrainConfigReader)(const char* path, GPTConfig* cfg, char* msg, size_t msg_len);
extern TrainConfigReader train_config_reader;
void train_setup_free(TrainSetup* s);

// Loads the checkpoint's parameters (flat layout, host memory) on every rank,
// exiting every rank with a message if the file cannot be read.
void train_load_checkpoint(const TrainSetup* s, float* params_host);

// ---------------------------------------------------------------- what a mesh needs of the model
// What a chapter splits along each axis, beyond what every chapter splits
// (the global batch over dp). Zero fields need nothing.
typedef struct {
    int microbatches;  // a dp rank's share of the batch runs in this many pieces (0: 1)
    int experts;       // MoE experts, split over ep (0: no experts)
    int whole_vocab;   // 1: tp leaves the vocabulary whole (chapter 7's model: wte on every tp rank)
} MeshNeeds;

// One check for every chapter, one message style: the batch over dp x
// microbatches, the heads and (but whole_vocab) the padded vocabulary over tp, the layers over
// pp, the sequence over cp, the experts over ep. On a mismatch every rank
// exits after rank 0 prints "X does not split over axis=N: use ...".
// needs may be NULL.
void train_check_mesh(const Mesh* mesh, const TrainSetup* s, const MeshNeeds* needs);
// The same check without MPI: NULL, or the message (in msg) rank 0 prints.
// The planner (tools/plan) calls it, so it refuses exactly what the
// chapters refuse here. size: the mesh's axis sizes; B, T the global batch.
const char* train_mesh_problem(const int size[NUM_AXES], const GPTConfig* c, int B, int T, const MeshNeeds* needs,
                               char* msg, size_t len);

#endif
