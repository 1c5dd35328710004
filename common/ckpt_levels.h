// ckpt_levels.h: level 1 (node-local) and level 2 (partner copies, xor
// parity) of the checkpoints, saved and resumed over MPI (docs/checkpoints.md,
// "Levels"). ckpt.c calls these; they write and read through ckpt_files.h.
#ifndef CKPT_LEVELS_H
#define CKPT_LEVELS_H

#include <stddef.h>

#include "ckpt.h"
#include "ckpt_files.h"

// Which ranks form a node, and the level-2 groups. Collective.
void ckpt_nodes_init(Ckpt* c, int ranks_per_node);
// LOCAL/node-K: node K's level-1 directory.
void ckpt_node_dir(const Ckpt* c, int node, char* out, size_t len);
// A level-1 save (with level 2) of the state in c->host. Collective.
void ckpt_save_local(Ckpt* c, int step);
// The newest level-1 step complete or rebuildable on this run's nodes, not
// older than floor, saved by this run or by the run of level 3's newest
// (level3_id; NULL: none), its manifest in *m; -1 if none (err, when a rank
// could not copy the manifest into scratch: the caller refuses). Collective.
int ckpt_local_pick(Ckpt* c, int floor, const unsigned long long* level3_id, CkptManifest* m, const char* scratch,
                    char* dir, size_t dir_len, char* report, size_t report_len, char* why, size_t why_len, char* err,
                    size_t err_len);
// The files this rank reads that its node lacks, from a rank whose node
// has them, into scratch; NULL, or why not in msg (the caller refuses).
// Collective.
const char* ckpt_local_fetch(Ckpt* c, CkptManifest* m, const int* use, const char* scratch, char* msg, size_t msg_len);

#endif
