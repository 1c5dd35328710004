// sharding.c: --show-sharding's table (sharding.h).
#include "sharding.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "memory.h"

static const char* const shapes[NUM_PARAM_TENSORS] = {
    "(Vp, C)", "(maxT, C)", "(L, C)", "(L, C)", "(L, 3C, C)", "(L, 3C)", "(L, C, C)", "(L, C)",
    "(L, C)", "(L, C)", "(L, 4C, C)", "(L, 4C)", "(L, C, 4C)", "(L, C)", "(C)", "(C)"};

const char* sharding_shape(ParamTensor t) { return shapes[t]; }

static void copy_field(char* dst, size_t len, const char* src) { snprintf(dst, len, "%s", src ? src : ""); }

void shard_table_add(ShardTable* t, const char* name, const char* shape, const char* params_spec,
                     const char* grads_spec, const char* optimizer_spec, const char* slice, double params,
                     double grads, double optimizer) {
    ShardRow* row = NULL;
    for (int i = 0; i < t->n && !row; i++)
        if (!strcmp(t->rows[i].name, name)) row = &t->rows[i];
    if (!row) {
        CHECK(t->n < (int)(sizeof(t->rows) / sizeof(t->rows[0])), "the sharding table is full");
        row = &t->rows[t->n++];
        memset(row, 0, sizeof(*row));
        copy_field(row->name, sizeof(row->name), name);
        copy_field(row->shape, sizeof(row->shape), shape);
        copy_field(row->slice, sizeof(row->slice), slice);
    }
    const char* specs[SHARD_STATES] = {params_spec, grads_spec, optimizer_spec};
    for (int s = 0; s < SHARD_STATES; s++)
        if (specs[s] && !row->spec[s][0]) copy_field(row->spec[s], sizeof(row->spec[s]), specs[s]);
    row->bytes[SHARD_PARAMS] += params;
    row->bytes[SHARD_GRADS] += grads;
    row->bytes[SHARD_OPTIMIZER] += optimizer;
}

int sharding_gpt_tensors(const GPTConfig* cfg, ShardTensor* out) {
    int n = 0, L = cfg->num_layers;
    for (ParamTensor p = 0; p < NUM_PARAM_TENSORS; p++) {
        int layers = param_tensor_is_block(p) ? L : 1;
        for (int l = 0; l < layers; l++) {
            ShardTensor* s = &out[n++];
            copy_field(s->name, sizeof(s->name), param_tensor_name(p));
            copy_field(s->shape, sizeof(s->shape), shapes[p]);
            copy_field(s->split, sizeof(s->split), "(-, -)");
            // the units: [wte wpe], block l, [lnfw lnfb]
            size_t at = gpt_tensor_offset(cfg, p, l);
            if (param_tensor_is_block(p)) s->unit = 1 + l, s->off = at - gpt_block_offset(cfg, l);
            else if (p == P_WTE || p == P_WPE) s->unit = 0, s->off = at;
            else s->unit = L + 1, s->off = at - gpt_tensor_offset(cfg, P_LNFW, 0);
            s->numel = param_tensor_numel(cfg, p);
        }
    }
    return n;
}

void sharding_add_flat(ShardTable* t, const ShardTensor* tensors, int n, const size_t* numel,
                       const size_t* shard, int n_units, int N, int r, int zero) {
    double f = sizeof(float);
    char flat[40], slice[40];  // split (24) + " flat/dp": the table cuts its own copy
    for (int i = 0; i < n; i++) {
        const ShardTensor* s = &tensors[i];
        // this rank's shard of the unit is [r S, (r + 1) S): its overlap with the tensor
        size_t S = shard[s->unit], lo = (size_t)r * S, hi = lo + S;
        size_t a = s->off > lo ? s->off : lo, b = s->off + s->numel < hi ? s->off + s->numel : hi;
        double mine = b > a ? (double)(b - a) : 0.0, whole = (double)s->numel;
        snprintf(flat, sizeof(flat), "%s flat/dp", s->split);
        if (b > a) snprintf(slice, sizeof(slice), "[%zu, %zu) of %zu", a - s->off, b - s->off, s->numel);
        else snprintf(slice, sizeof(slice), "none");
        // a tensor held as several tiles in one unit (chapter 4's qkvw: the
        // q, k and v rows of this rank's heads): the row's text counts them
        // all, the floats this rank holds of the tiles' floats
        int tiles = 0;
        size_t held = 0, of = 0;
        for (int j = 0; j < n; j++) {
            const ShardTensor* o = &tensors[j];
            if (o->unit != s->unit || strcmp(o->name, s->name)) continue;
            size_t oa = o->off > lo ? o->off : lo, ob = o->off + o->numel < hi ? o->off + o->numel : hi;
            tiles++, of += o->numel, held += ob > oa ? ob - oa : 0;
        }
        if (tiles > 1) snprintf(slice, sizeof(slice), "%d tiles: %zu of %zu", tiles, held, of);
        shard_table_add(t, s->name, s->shape, zero == 3 ? flat : s->split, flat, flat, slice,
                        f * (zero == 3 ? mine : whole), f * mine, 2 * f * mine);
    }
    // the tails of the shards past each unit's end: zeros, held all the same
    for (int u = 0; u < n_units; u++) {
        size_t lo = (size_t)r * shard[u], real = lo >= numel[u] ? 0 : numel[u] - lo;
        double pad = (double)(shard[u] - (real < shard[u] ? real : shard[u]));
        double pad_all = (double)(shard[u] * N - numel[u]);  // ZeRO-1/2: the full padded parameters
        shard_table_add(t, "padding", "", "flat/dp", "flat/dp", "flat/dp", "the shards' tails",
                        f * (zero == 3 ? pad : pad_all), f * pad, 2 * f * pad);
    }
}

void sharding_add_ranges(ShardTable* t, const GPTConfig* cfg, const size_t* global, const size_t* count,
                         const int* copy, int n, const char* block_spec) {
    double f = sizeof(float);
    for (ParamTensor p = 0; p < NUM_PARAM_TENSORS; p++) {
        int block = param_tensor_is_block(p), layers = block ? cfg->num_layers : 1;
        size_t numel = param_tensor_numel(cfg, p);
        for (int tied = 0; tied < 2; tied++) {  // the tensor, then a second (tied) copy of it
            double mine = 0.0;
            char slice[40] = "layers", name[24];
            size_t used = strlen(slice);
            for (int l = 0; l < layers; l++) {
                double here = 0.0;
                size_t lo = gpt_tensor_offset(cfg, p, l), hi = lo + numel;
                for (int i = 0; i < n; i++) {
                    if (copy[i] != tied) continue;
                    size_t a = lo > global[i] ? lo : global[i];
                    size_t b = hi < global[i] + count[i] ? hi : global[i] + count[i];
                    if (b > a) here += (double)(b - a);
                }
                if (here > 0 && used + 8 < sizeof(slice))
                    used += (size_t)snprintf(slice + used, sizeof(slice) - used, "%s%d", mine > 0 ? ", " : " ", l);
                mine += here;
            }
            if (mine == 0.0) continue;
            snprintf(name, sizeof(name), "%s%s", param_tensor_name(p), tied ? " copy" : "");
            if (!block) snprintf(slice, sizeof(slice), "%s", tied ? "the tied copy" : "all");
            const char* spec = block ? block_spec : "(one stage)";
            shard_table_add(t, name, shapes[p], spec, spec, spec, slice, f * mine, f * mine, 2 * f * mine);
        }
    }
}

void sharding_add_replicated(ShardTable* t, const GPTConfig* cfg, int has_optimizer) {
    double f = sizeof(float);
    for (ParamTensor p = 0; p < NUM_PARAM_TENSORS; p++) {
        double numel = (double)param_tensor_numel(cfg, p) * (param_tensor_is_block(p) ? cfg->num_layers : 1);
        shard_table_add(t, param_tensor_name(p), shapes[p], "(-, -)", "(-, -)", has_optimizer ? "(-, -)" : "none",
                        "all", f * numel, f * numel, has_optimizer ? 2 * f * numel : 0.0);
    }
}

static int shown = 0;
int sharding_shown(void) { return shown; }

void shard_table_show(const ShardTable* t, int show, const char* title) {
    if (!show) return;
    shown = 1;
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    double mine[SHARD_STATES] = {0};
    for (int i = 0; i < t->n; i++)
        for (int s = 0; s < SHARD_STATES; s++) mine[s] += t->rows[i].bytes[s];
    double* all = rank == 0 ? xmalloc(sizeof(double) * SHARD_STATES * (size_t)size) : NULL;
    MPI_CHECK(MPI_Gather(mine, SHARD_STATES, MPI_DOUBLE, all, SHARD_STATES, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    if (rank == 0) {
        printf("sharding (%s), rank 0's table: (tp, -) splits a layer's (out, in) matrix over tp by rows, - keeps\n"
               "a dimension whole; flat/dp: each unit's floats in equal shards over dp; a block tensor's slice is\n"
               "layer 0's (docs/00_mesh.md)\n", title);
        printf("  %-13s %-11s %-20s %-20s %-20s %-22s %11s %11s %11s\n", "tensor", "shape", "params", "grads",
               "AdamW m, v", "rank 0 holds", "params B", "grads B", "AdamW B");
        for (int i = 0; i < t->n; i++) {
            const ShardRow* w = &t->rows[i];
            printf("  %-13s %-11s %-20s %-20s %-20s %-22s %11.0f %11.0f %11.0f\n", w->name, w->shape, w->spec[0],
                   w->spec[1], w->spec[2], w->slice, w->bytes[0], w->bytes[1], w->bytes[2]);
        }
        for (int r = 0; r < size; r++)
            printf("sharding totals rank %d: params %.0f grads %.0f optimizer %.0f\n", r, all[r * SHARD_STATES],
                   all[r * SHARD_STATES + 1], all[r * SHARD_STATES + 2]);
        fflush(stdout);
    }
    free(all);
}

void sharding_show_replicated(const GPTConfig* cfg, int has_optimizer, int show, const char* title) {
    if (!show) return;
    ShardTable t = {.n = 0};
    sharding_add_replicated(&t, cfg, has_optimizer);
    shard_table_show(&t, show, title);
}
