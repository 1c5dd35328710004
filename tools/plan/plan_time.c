// plan_time.c: the planner's step-time model (plan_time.h states it).
#include "plan_time.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "memory.h"
#include "mesh.h"
#include "model_layout.h"
#include "ops.h"
#include "paths.h"
#include "report.h"  // JsonBuf: --json's line
#include "runtime.h"

// ---------------------------------------------------------------- the profile file

static char* pt_trim(char* s) {
    while (isspace((unsigned char)*s)) s++;
    char* e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

// The named figures of the model; NULL for a key it does not know.
static double* pt_field(MachineProfile* p, const char* key) {
    static const struct {
        const char* key;
        size_t offset;
    } fields[] = {
        {"compute_shared", offsetof(MachineProfile, compute_shared)},
        {"ranks_per_node", offsetof(MachineProfile, ranks_per_node)},
        {"matmul_gflops", offsetof(MachineProfile, matmul_gflops)},
        {"rowwise_gflops", offsetof(MachineProfile, rowwise_gflops)},
        {"attention_gflops", offsetof(MachineProfile, attention_gflops)},
        {"memory_gbps", offsetof(MachineProfile, memory_gbps)},
        {"overlap", offsetof(MachineProfile, overlap)},
        {"element_bytes", offsetof(MachineProfile, element_bytes)},
        {"link.intra.gbps", offsetof(MachineProfile, intra_gbps)},
        {"link.intra.latency_us", offsetof(MachineProfile, intra_latency_us)},
        {"link.inter.gbps", offsetof(MachineProfile, inter_gbps)},
        {"link.inter.latency_us", offsetof(MachineProfile, inter_latency_us)},
        {"link.base_latency_us", offsetof(MachineProfile, base_latency_us)},
        {"memory_gb", offsetof(MachineProfile, memory_gb)},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        if (!strcmp(key, fields[i].key)) return (double*)((char*)p + fields[i].offset);
    return NULL;
}

// "coll.NAME.pN.alpha_us" or "coll.NAME.pN.busbw_gbps": the slot, or NULL
static double* pt_coll_field(MachineProfile* p, const char* key, char* why, size_t len) {
    char name[32], what[32];
    int group = 0, used = 0;
    if (sscanf(key, "coll.%31[a-z_].p%d.%31[a-z_]%n", name, &group, what, &used) != 3 || key[used]) {
        snprintf(why, len, "'%s' is not coll.COLLECTIVE.pN.alpha_us or .busbw_gbps", key);
        return NULL;
    }
    int c = -1;
    for (int k = 0; k < NUM_COLLECTIVES; k++)
        if (!strcmp(name, collective_name((Collective)k))) c = k;
    if (c < 0) {
        snprintf(why, len, "'%s': no collective named '%s'", key, name);
        return NULL;
    }
    if (group < 2 || group > PT_MAX_GROUP) {
        snprintf(why, len, "'%s': the group size must be 2 to %d", key, PT_MAX_GROUP);
        return NULL;
    }
    if (!strcmp(what, "alpha_us")) return &p->alpha_us[c][group];
    if (!strcmp(what, "busbw_gbps")) return &p->busbw_gbps[c][group];
    snprintf(why, len, "'%s': a collective's figures are alpha_us and busbw_gbps", key);
    return NULL;
}

// plan_profile_read walks the figures as one array of doubles
_Static_assert(sizeof(MachineProfile) ==
                   offsetof(MachineProfile, compute_shared) +
                       sizeof(double) * (14 + 2 * NUM_COLLECTIVES * (PT_MAX_GROUP + 1)),
               "MachineProfile: every field after the name is a double");

const char* plan_profile_read(const char* path, MachineProfile* p, char* msg, size_t len) {
    // every figure is a double after the name: one array, so "given twice"
    // can be tracked by index, whatever key names the slot
    memset(p, 0, sizeof(*p));
    size_t n_figures = (sizeof(*p) - offsetof(MachineProfile, compute_shared)) / sizeof(double);
    double* all = (double*)((char*)p + offsetof(MachineProfile, compute_shared));
    for (size_t i = 0; i < n_figures; i++) all[i] = PT_UNKNOWN;
    if (paths_check_regular("--profile", path, "give a text file of 'key = value' lines (make profile writes one)", msg, len))
        return msg;
    unsigned char* seen = calloc(n_figures, 1);
    FILE* f = fopen(path, "r");
    if (!f || !seen) {
        snprintf(msg, len, "%s: cannot read the profile (%s): make profile writes this machine's to "
                 "build/profile.txt; tools/plan/profiles/ holds GPUs'", path, strerror(f ? ENOMEM : errno));
        free(seen);
        if (f) fclose(f);
        return msg;
    }
    char* line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    int lineno = 0;
    const char* bad = NULL;
    while (!bad && (got = getline(&line, &line_cap, f)) >= 0) {
        lineno++;
        char* hash = memchr(line, '#', (size_t)got);
        size_t col = paths_not_text(line, hash ? (size_t)(hash - line) : (size_t)got);
        if (col) {  // binary, not a profile: say where, quote nothing
            snprintf(msg, len, "%s:%d: byte %zu is not text: a profile is 'key = value' lines", path, lineno, col);
            bad = msg;
            break;
        }
        if (hash) *hash = '\0';  // the source, after the figure
        char* s = pt_trim(line);
        if (!*s) continue;
        char* eq = strchr(s, '=');
        if (!eq) {
            snprintf(msg, len, "%s:%d: expected 'key = value', got '%s'", path, lineno, s);
            bad = msg;
            break;
        }
        *eq = '\0';
        char *key = pt_trim(s), *value = pt_trim(eq + 1);
        if (!strcmp(key, "name")) {
            snprintf(p->name, sizeof(p->name), "%s", value);
            continue;
        }
        if (!strncmp(key, "info.", 5)) continue;  // a figure kept for the reader (a datasheet's other peaks)
        char why[256];
        double* slot = !strncmp(key, "coll.", 5) ? pt_coll_field(p, key, why, sizeof(why)) : pt_field(p, key);
        if (!slot) {
            if (strncmp(key, "coll.", 5)) snprintf(why, sizeof(why), "unknown key '%s'", key);
            snprintf(msg, len, "%s:%d: %s", path, lineno, why);
            bad = msg;
            break;
        }
        size_t idx = (size_t)(slot - all);
        if (seen[idx]) {
            snprintf(msg, len, "%s:%d: '%s' given twice", path, lineno, key);
            bad = msg;
            break;
        }
        seen[idx] = 1;
        if (!strcmp(value, "unknown")) continue;
        char* end = NULL;
        double v = strtod(value, &end);
        if (!*value || *end || !isfinite(v) || v < 0) {
            snprintf(msg, len, "%s:%d: '%s' is not a number >= 0 or 'unknown' (key '%s')", path, lineno, value, key);
            bad = msg;
            break;
        }
        const char* range = NULL;
        if ((!strcmp(key, "compute_shared") && v != 0 && v != 1)) range = "0 or 1";
        else if (!strcmp(key, "overlap") && v > 1) range = "from 0 to 1";
        else if (!strcmp(key, "element_bytes") && v != 2 && v != 4) range = "2 or 4";
        // rates of a real device: a subnormal one divided a step into inf or nan
        else if ((strstr(key, "gflops") || strstr(key, "gbps")) && (v < 1e-6 || v > 1e9))
            range = "from 1e-6 to 1e9";
        else if (strstr(key, "_us") && v > 1e9) range = "at most 1e9 (a thousand seconds)";
        else if (!strcmp(key, "ranks_per_node") && (v < 1 || v != floor(v) || v > 1e9)) range = "a whole number >= 1";
        if (range) {
            snprintf(msg, len, "%s:%d: '%s' must be %s, got %s", path, lineno, key, range, value);
            bad = msg;
            break;
        }
        *slot = v;
    }
    free(line);
    fclose(f);
    free(seen);
    if (!bad) {
        // a fit needs both figures
        for (int c = 0; c < NUM_COLLECTIVES && !bad; c++)
            for (int g = 2; g <= PT_MAX_GROUP && !bad; g++)
                if ((p->alpha_us[c][g] == PT_UNKNOWN) != (p->busbw_gbps[c][g] == PT_UNKNOWN)) {
                    snprintf(msg, len, "%s: coll.%s.p%d has only one of alpha_us and busbw_gbps", path,
                             collective_name((Collective)c), g);
                    bad = msg;
                }
    }
    if (!bad && p->element_bytes == PT_UNKNOWN) p->element_bytes = 4;
    if (!bad && p->compute_shared == PT_UNKNOWN) p->compute_shared = 0;
    if (!bad && p->overlap == PT_UNKNOWN) p->overlap = 0;
    if (!bad && !p->name[0]) snprintf(p->name, sizeof(p->name), "%s", path);  // unnamed: its file names it
    return bad;
}

// ---------------------------------------------------------------- the work of a step

// Tp rank `rank`'s rows of the padded vocabulary over tp (chapter 4's split:
// ceil(Vp/tp) each, the last fewer).
static double vocab_rows(double Vp, int tp, int rank) {
    if (tp <= 1) return Vp;
    double per = ceil(Vp / tp), left = Vp - rank * per;
    return left < per ? left : per;
}

// Chapters 5 to 7 (plan_time.h): the plan's FLOPs, split into attention and
// the matmuls by the count the other chapters use.
static int work_from_plan(const GPTConfig* cfg, const PtChapter* ch, double opt_params, double grad_params,
                          StepWork* w) {
    memset(w, 0, sizeof(*w));
    double L = cfg->num_layers, C = cfg->channels, T = ch->T, Vp = cfg->padded_vocab_size;
    double tp = ch->chapter == 6 && ch->tp > 1 ? ch->tp : 1;
    double n = (double)ch->B / ch->dp * T, Lr = L, Vl = Vp;
    if ((ch->chapter == 5 || ch->chapter == 7) && ch->pp > 1) {  // the rank's stages: L / pp layers
        Lr = L / ch->pp;
        Vl = ch->pp_rank == ch->pp - 1 ? Vp : 0;  // the head on the last (its last chunk's)
    }
    if (ch->chapter == 6 || ch->chapter == 7) n /= ch->cp;  // chapter 7 composes cp too
    if (ch->chapter == 6 && ch->sp) Vl = vocab_rows(Vp, ch->tp, ch->tp_rank);  // chapter 4's vocabulary-parallel head
    // chapter 7's tp is sequence-parallel attention (composed_attention.c): a rank
    // keeps B / (dp ep tp) whole sequences and runs every op on them at full
    // width, its heads' attention over the group's gathered rows: the same
    // FLOPs as its own rows with every head
    if (ch->chapter == 7) n /= (double)ch->ep * (ch->tp > 1 ? ch->tp : 1);
    double attn = 12.0 * n * Lr * T * C / tp;
    w->attention_flops = ch->recompute == RECOMPUTE_FULL ? attn * 4.0 / 3.0 : attn;
    w->matmul_flops = ch->plan_flops - w->attention_flops;
    if (w->matmul_flops < 0) w->matmul_flops = 0;
    w->rowwise_flops = ch->plan_rowwise_flops < w->matmul_flops ? ch->plan_rowwise_flops : w->matmul_flops;
    // chapter 6's --sp keeps the LayerNorms and residual adds on its n / tp tokens
    w->memory_bytes = 4.0 * (n * (Lr * (18.0 * C / tp + 20.0 * C / tp) + 4.0 * Vl) + 7.0 * opt_params + grad_params);
    w->ranks_on_node = 1;
    w->bubble = ch->chapter == 5 || ch->chapter == 7 ? ch->bubble : 0;  // 0 without a pipeline
    return 1;
}

int plan_time_work(const GPTConfig* cfg, const PtChapter* ch, double opt_params, double grad_params,
                   StepWork* w) {
    if (ch->chapter >= 5 && ch->chapter <= 7) return work_from_plan(cfg, ch, opt_params, grad_params, w);
    if (ch->chapter != 0 && ch->chapter != 2 && ch->chapter != 3 && ch->chapter != 4) return 0;
    memset(w, 0, sizeof(*w));
    double L = cfg->num_layers, C = cfg->channels, T = ch->T, tp = ch->chapter == 4 ? ch->tp : 1;
    int dp = ch->chapter == 0 ? 1 : ch->dp;
    double n = (double)ch->B / dp * T;
    // the rank's rows of the padded vocabulary (chapter 4: ceil(Vp/tp), the last fewer)
    double Vp = cfg->padded_vocab_size, Vl = vocab_rows(Vp, (int)tp, ch->tp_rank);
    double block = 12.0 * L * C * C / tp;
    w->matmul_flops = 6.0 * n * (block + Vl * C);
    w->attention_flops = 12.0 * n * L * T * C / tp;
    // full reruns each block's forward; selective only a GELU, which is
    // element-wise (the flash attention keeps its lse: no attention to redo,
    // docs/recompute.md), and the model counts no recomputed traffic
    if (ch->recompute == RECOMPUTE_FULL) {
        w->matmul_flops += 2.0 * n * block;
        w->attention_flops += 4.0 * n * L * T * C / tp;
    }
    // layernorms (2 per block: 2C forward, 4C backward each) and residuals
    // (2 per block, 3C each) on every tp rank; GELU (4C/tp wide: 2 forward,
    // 3 backward); the loss (4 per vocabulary row); AdamW (read p, g, m, v;
    // write p, m, v); zeroing the gradient
    w->memory_bytes = 4.0 * (n * (L * (18.0 * C + 20.0 * C / tp) + 4.0 * Vl) + 7.0 * opt_params + grad_params);
    w->ranks_on_node = 1;
    w->bubble = 0;
    return 1;
}

void plan_time_add_coll(StepWork* w, const PtChapter* ch, Collective coll, int on_dp, int group, int nodes,
                        double calls, double bus_bytes) {
    if (w->n_coll >= PT_MAX_COLLS || calls <= 0) return;
    double hide = 0;
    // chapter 2 overlapped: a bucket starts as backward makes its gradients
    // final, all waited for at the end; those holding wte or wpe start only
    // at the embedding's hook, the end of backward, with nothing to hide behind
    if (ch->chapter == 2 && ch->dp_mode && !strcmp(ch->dp_mode, "overlapped") && coll == COLL_ALLREDUCE && on_dp)
        hide = (ch->early_buckets < calls ? ch->early_buckets : calls) / calls;
    // ZeRO-3 with prefetch (chapter 6's --sp runs chapter 4's engine so):
    // each unit's gather over dp starts while the unit before computes
    int zero3 = ((ch->chapter == 3 || ch->chapter == 4) && ch->zero == 3 && ch->prefetch) || (ch->chapter == 6 && ch->sp);
    if (zero3 && coll == COLL_ALLGATHER && on_dp) hide = (calls - 1) / calls;
    PtColl* c = &w->coll[w->n_coll++];
    c->coll = coll;
    c->group = group;
    c->nodes = nodes < 1 ? 1 : nodes;
    c->calls = calls;
    c->bus_bytes = bus_bytes;
    c->hideable = hide;
}

// ---------------------------------------------------------------- the prediction

// A latency the profile does not give is taken as 0 (and said: the time is
// then a lower bound).
static double pt_latency(double us, StepTime* t) {
    if (us != PT_UNKNOWN) return us * 1e-6;
    if (t) t->unknown_latency = 1;
    return 0;
}

// plan_time.h gives the model and docs/planner.md its derivation. The
// latencies are per call; calls multiplies them, the bus bytes are the
// step's sum already.
static double pt_link(const MachineProfile* p, Collective c, int group, int nodes, double calls, double bus_bytes,
                      double s, int* tree, StepTime* t) {
    if (tree) *tree = 0;
    int n = nodes < 1 ? 1 : nodes > group ? group : nodes;
    double k = (double)group / n;
    double bw = (n == 1 ? p->intra_gbps : p->inter_gbps) * 1e9;
    double base = pt_latency(p->base_latency_us, t), li = pt_latency(p->intra_latency_us, t);
    double le = n > 1 ? pt_latency(p->inter_latency_us, t) : 0;
    double hop = n > 1 ? le : li;  // one message's latency: the slowest link it may cross
    double bandwidth = bus_bytes * s / bw;
    double steps, inter;
    switch (c) {
        case COLL_ALLREDUCE: steps = 2.0 * (group - 1), inter = 2.0 * (n - 1); break;
        case COLL_REDUCE_SCATTER:
        case COLL_ALLGATHER: steps = group - 1.0, inter = n - 1.0; break;
        case COLL_RECV: return 0;  // a message's time is its send's
        default:  // broadcast, reduce, all-to-all, send: one latency, the messages pipelined or at once
            return calls * (base + hop) + bandwidth;
    }
    double ring = calls * (base + (steps - inter) * li + inter * le) + bandwidth;
    if (c != COLL_ALLREDUCE || n == 1) return ring;
    // the buffer of one call, S = bus p / (2 (p-1)); the tree moves 2 S each way
    double buffer = bus_bytes * group / (2.0 * (group - 1));
    double tree_s = calls * (base + 2.0 * ((k - 1) * li + log2((double)n) * le)) + 2.0 * buffer * s / bw;
    if (tree_s < ring) {
        if (tree) *tree = 1;
        return tree_s;
    }
    return ring;
}

double plan_time_link_seconds(const MachineProfile* p, Collective c, int group, int nodes, double calls,
                              double bus_bytes, double s, int* tree) {
    return group < 2 ? 0 : pt_link(p, c, group, nodes, calls, bus_bytes, s, tree, NULL);
}

static double pt_coll_seconds(const MachineProfile* p, const PtColl* c, double s, StepTime* t) {
    if (c->group < 2) return 0;  // a group of one sends nothing
    if (c->coll == COLL_RECV) return 0;  // a message's time is its send's
    // a message between two ranks, without a fit or a link of its own, is
    // what an all-to-all on 2 ranks sends each way: chapter 1's fit of that
    if (c->coll == COLL_SEND && p->busbw_gbps[COLL_SEND][2] == PT_UNKNOWN && p->intra_gbps == PT_UNKNOWN &&
        p->busbw_gbps[COLL_ALLTOALL][2] != PT_UNKNOWN)
        return c->calls * p->alpha_us[COLL_ALLTOALL][2] * 1e-6 +
               c->bus_bytes * s / (p->busbw_gbps[COLL_ALLTOALL][2] * 1e9);
    int g = c->group <= PT_MAX_GROUP ? c->group : PT_MAX_GROUP, best = -1;
    for (int k = 2; k <= PT_MAX_GROUP; k++)
        if (p->busbw_gbps[c->coll][k] != PT_UNKNOWN && (best < 0 || abs(k - g) < abs(best - g))) best = k;
    if (best >= 0) {
        if (best != c->group) t->used_nearest_fit = 1;
        return c->calls * p->alpha_us[c->coll][best] * 1e-6 + c->bus_bytes * s / (p->busbw_gbps[c->coll][best] * 1e9);
    }
    t->used_link_model = 1;
    int intra = c->nodes <= 1;
    if ((intra ? p->intra_gbps : p->inter_gbps) == PT_UNKNOWN) {
        t->missing = intra ? "link.intra.gbps (or a fit coll.NAME.pN)" : "link.inter.gbps (or a fit coll.NAME.pN)";
        return 0;
    }
    int tree = 0;
    double sec = pt_link(p, c->coll, c->group, c->nodes, c->calls, c->bus_bytes, s, &tree, t);
    if (tree) t->used_tree = 1;
    return sec;
}

void plan_time_predict(const MachineProfile* p, const StepWork* w, StepTime* t) {
    memset(t, 0, sizeof(*t));
    double r = 1;
    if (p->compute_shared == 1) {
        r = w->ranks_on_node;
        if (p->ranks_per_node != PT_UNKNOWN && r > p->ranks_per_node) r = p->ranks_per_node;
    }
    double s = p->element_bytes / 4.0;
    if (p->matmul_gflops == PT_UNKNOWN) t->missing = "matmul_gflops";
    else if (p->attention_gflops == PT_UNKNOWN) t->missing = "attention_gflops";
    else if (p->memory_gbps == PT_UNKNOWN) t->missing = "memory_gbps";
    if (t->missing) return;
    // chapter 7's experts multiply row by row (ops.h), at their own rate when
    // the profile has it (build/roofline measures it; a datasheet has none)
    double rowwise_gflops = p->rowwise_gflops != PT_UNKNOWN ? p->rowwise_gflops : p->matmul_gflops;
    double matmul = ((w->matmul_flops - w->rowwise_flops) / p->matmul_gflops + w->rowwise_flops / rowwise_gflops) * r / 1e9;
    double attention = w->attention_flops * r / (p->attention_gflops * 1e9);
    double other = w->memory_bytes * s * r / (p->memory_gbps * 1e9);
    double comm = 0, hideable = 0;
    for (int i = 0; i < w->n_coll; i++) {
        double sec = pt_coll_seconds(p, &w->coll[i], s, t);
        comm += sec;
        hideable += sec * w->coll[i].hideable;
    }
    double hidden = p->overlap * hideable;
    if (hidden > matmul + attention) hidden = matmul + attention;
    double exposed = comm - hidden;
    double bubble = w->bubble > 0 && w->bubble < 1 ? (matmul + attention + other) * w->bubble / (1 - w->bubble) : 0;
    t->matmul_ms = 1e3 * matmul;
    t->attention_ms = 1e3 * attention;
    t->other_ms = 1e3 * other;
    t->comm_ms = 1e3 * comm;
    t->hidden_ms = 1e3 * hidden;
    t->exposed_ms = 1e3 * exposed;
    t->bubble_ms = 1e3 * bubble;
    t->total_ms = 1e3 * (matmul + attention + other + exposed + bubble);
}

// ---------------------------------------------------------------- the planner's hook

// The axes of a counter slot's group (a bit each): one axis, the world, or
// for a group over several axes ("dp+cp") theirs. The tied embedding's group
// (the pipeline's two ends) is EMBEDDING_GROUP; a group of listed ranks is
// the world (its bound).
#define EMBEDDING_GROUP (~0u)
static unsigned slot_axes(int slot) {
    const unsigned all = (1u << NUM_AXES) - 1;
    if (slot < NUM_AXES) return 1u << slot;
    if (slot == COMM_WORLD_AXIS) return all;
    if (!strcmp(comm_axis_name(slot), "embedding")) return EMBEDDING_GROUP;
    char name[64];
    snprintf(name, sizeof(name), "%s", comm_axis_name(slot));
    unsigned axes = 0;
    for (char* part = strtok(name, "+"); part; part = strtok(NULL, "+"))
        for (int a = 0; a < NUM_AXES; a++)
            if (!strcmp(part, mesh_axis_name((MeshAxis)a))) axes |= 1u << a;
    return axes ? axes : all;
}

static int slot_group_size(int slot, const int* mesh) {
    unsigned axes = slot_axes(slot);
    if (axes == EMBEDDING_GROUP) return 2;
    int size = 1;
    for (int a = 0; a < NUM_AXES; a++)
        if (axes & (1u << a)) size *= mesh[a];
    return size;
}

void plan_time_nodes_init(PtNodes* n, const MachineProfile* p, const int* mesh, int ranks) {
    memset(n, 0, sizeof(*n));
    memcpy(n->mesh, mesh, sizeof(n->mesh));
    n->ranks = ranks;
    n->ranks_per_node = p->ranks_per_node;
}

void plan_time_nodes_free(PtNodes* n) {
    for (int x = 0; x < COMM_MAX_SLOTS; x++) free(n->nodes[x]);
    free(n->seen);
    memset(n, 0, sizeof(*n));
}

// The nodes that hold the group of `slot` which rank r is in:
// ranks_per_node ranks a node in world-rank order, the group's members the
// ranks whose coordinates differ from r's only on the group's axes (mesh.h's
// order). 1 when the profile has no ranks_per_node. The first ask of a slot
// lists every group once and notes its count for each of its members.
static int slot_group_nodes(PtNodes* n, int slot, int r) {
    double rpn = n->ranks_per_node;
    if (rpn == PT_UNKNOWN || rpn < 1) return 1;
    if (n->nodes[slot]) return n->nodes[slot][r];
    Mesh m;
    memset(&m, 0, sizeof(m));
    for (int x = 0; x < NUM_AXES; x++) m.size[x] = n->mesh[x];
    int n_nodes = (int)ceil(n->ranks / rpn);
    int* count = xmalloc((size_t)n->ranks * sizeof(int));
    for (int q = 0; q < n->ranks; q++) count[q] = -1;
    if (!n->seen) n->seen = xcalloc((size_t)n_nodes, sizeof(int));
    unsigned axes = slot_axes(slot);
    int* members = xmalloc((size_t)n->ranks * sizeof(int));
    for (int q = 0; q < n->ranks; q++) {
        if (count[q] >= 0) continue;
        int coord[NUM_AXES], c[NUM_AXES], k = 0;
        mesh_coord_of(&m, q, coord);
        memcpy(c, coord, sizeof(c));
        if (axes == EMBEDDING_GROUP) {  // stage 0 and the last stage of q's pipeline
            c[AXIS_PP] = 0;
            members[k++] = mesh_rank_at(&m, c);
            c[AXIS_PP] = m.size[AXIS_PP] - 1;
            if (mesh_rank_at(&m, c) != members[0]) members[k++] = mesh_rank_at(&m, c);
            int ends = (int)(members[0] / rpn) == (int)(members[k - 1] / rpn) ? 1 : 2;
            count[q] = ends;  // a middle stage sends nothing there: its figure is never used
            for (int i = 0; i < k; i++) count[members[i]] = ends;
            continue;
        } else {
            for (int a = 0; a < NUM_AXES; a++)
                if (axes & (1u << a)) c[a] = 0;
            for (;;) {  // every member: an odometer over the group's axes
                members[k++] = mesh_rank_at(&m, c);
                int a = NUM_AXES - 1;
                for (; a >= 0; a--) {
                    if (!(axes & (1u << a))) continue;
                    if (++c[a] < m.size[a]) break;
                    c[a] = 0;
                }
                if (a < 0) break;
            }
        }
        int nodes = 0;
        for (int i = 0; i < k; i++) {
            int node = (int)(members[i] / rpn);
            if (!n->seen[node]) n->seen[node] = 1, nodes++;
        }
        for (int i = 0; i < k; i++) {
            n->seen[(int)(members[i] / rpn)] = 0;
            if (count[members[i]] < 0) count[members[i]] = nodes;
        }
    }
    free(members);
    n->nodes[slot] = count;
    return count[r];
}

// The nodes ranks r and q sit on: 1 or 2 (1 when the profile has no ranks_per_node).
static int pair_nodes(const PtNodes* n, int r, int q) {
    double rpn = n->ranks_per_node;
    if (rpn == PT_UNKNOWN || rpn < 1) return 1;
    return (int)(r / rpn) == (int)(q / rpn) ? 1 : 2;
}

void plan_time_rank(const MachineProfile* p, const GPTConfig* cfg, const PtChapter* ch_in, PtNodes* nodes, int r,
                    const double* peak, const CommCount (*comm)[COMM_MAX_SLOTS], int steps, StepTime* t) {
    const int* mesh = nodes->mesh;
    int ranks = nodes->ranks;
    PtChapter ch = *ch_in;
    Mesh m;
    memset(&m, 0, sizeof(m));
    for (int x = 0; x < NUM_AXES; x++) m.size[x] = mesh[x];
    int coord[NUM_AXES];
    mesh_coord_of(&m, r, coord);
    ch.tp_rank = coord[AXIS_TP];
    ch.pp_rank = coord[AXIS_PP];
    StepWork w;
    if (!plan_time_work(cfg, &ch, peak[MEM_OPTIMIZER] / 8.0, peak[MEM_GRADS] / 4.0, &w)) {
        memset(t, 0, sizeof(*t));
        t->missing = "a chapter the time model knows (0, 2 to 7)";
        return;
    }
    // the ranks sharing r's node (a CPU's cores): ranks_per_node a node in
    // world-rank order, the last node holding what is left
    double rpn = p->ranks_per_node;
    w.ranks_on_node = ranks;
    if (rpn != PT_UNKNOWN && rpn >= 1) {
        double first = floor(r / rpn) * rpn;
        w.ranks_on_node = (int)(ranks - first < rpn ? ranks - first : rpn);
    }
    for (int c = 0; c < NUM_COLLECTIVES; c++)
        for (int x = 0; x < COMM_MAX_SLOTS; x++) {
            const CommCount* q = &comm[c][x];
            if (q->calls == 0) continue;
            int group = slot_group_size(x, mesh), spans = slot_group_nodes(nodes, x, r);
            if (c == COLL_SEND && x == AXIS_PP && ch.pp > 1) {
                // a stage's messages go to its two neighbours, each over the
                // link between the pair (one node or two), not the pp group's
                for (int dir = 0; dir < 2; dir++) {
                    int at[NUM_AXES];
                    memcpy(at, coord, sizeof(at));
                    at[AXIS_PP] = (coord[AXIS_PP] + (dir ? ch.pp - 1 : 1)) % ch.pp;
                    double share = dir ? 1.0 - ch.pp_next_share : ch.pp_next_share;
                    plan_time_add_coll(&w, &ch, COLL_SEND, 0, 2, pair_nodes(nodes, r, mesh_rank_at(&m, at)),
                                       share * q->calls / steps, share * q->bus_bytes / steps);
                }
                continue;
            }
            plan_time_add_coll(&w, &ch, (Collective)c, x == AXIS_DP, group, spans, q->calls / steps, q->bus_bytes / steps);
        }
    plan_time_predict(p, &w, t);
    t->one_node = t->used_link_model && ranks > 1 && (rpn == PT_UNKNOWN || rpn < 1);
}

void plan_time_add_notes(StepTime* into, const StepTime* t, int n) {
    for (int r = 0; r < n; r++) {
        into->used_nearest_fit |= t[r].used_nearest_fit;
        into->used_link_model |= t[r].used_link_model;
        into->unknown_latency |= t[r].unknown_latency;
        into->used_tree |= t[r].used_tree;
        into->one_node |= t[r].one_node;
    }
}

void plan_time_print_notes(const StepTime* t) {
    if (t->used_nearest_fit) printf("  note: a group size without its own fit was timed with the nearest size's\n");
    if (t->used_link_model) printf("  note: collectives without a fit were timed by the link model\n");
    if (t->unknown_latency) printf("  note: a link latency is unknown in the profile: taken as 0 (the time is a lower bound)\n");
    if (t->used_tree) printf("  note: an all-reduce across nodes was priced as NCCL's tree, faster there than its ring\n");
    if (t->one_node)
        printf("  note: the profile has no ranks_per_node: every group was priced on one node's links (a lower bound "
               "across nodes)\n");
}

int plan_time_print(const MachineProfile* p, const StepTime* per_rank, int ranks, double tokens_per_step,
                    double peak, int peak_rank, int json) {
    int slow = 0;
    for (int r = 0; r < ranks; r++) {
        if (per_rank[r].missing) {
            fprintf(stderr, "error: the profile '%s' has no %s\n", p->name, per_rank[r].missing);
            return 1;
        }
        if (per_rank[r].total_ms > per_rank[slow].total_ms) slow = r;
    }
    const StepTime* t = &per_rank[slow];
    double tps = tokens_per_step / (t->total_ms / 1e3);
    if (json) {  // report.h's JSON: the profile's name escaped, a figure that is not finite null
        JsonBuf b = {0};
        json_add_string(&b, "profile", p->name);
        json_add_double(&b, "ms_per_step", t->total_ms, "%.3f");
        json_add_double(&b, "tokens_per_s", tps, "%.1f");
        json_add_double(&b, "tokens_per_s_per_rank", tps / ranks, "%.1f");
        json_add_int(&b, "slowest_rank", slow);
        const char* keys[] = {"matmul_ms", "attention_ms", "other_ms", "comm_ms", "hidden_ms", "exposed_comm_ms", "bubble_ms"};
        double ms[] = {t->matmul_ms, t->attention_ms, t->other_ms, t->comm_ms, t->hidden_ms, t->exposed_ms, t->bubble_ms};
        for (int k = 0; k < 7; k++) json_add_double(&b, keys[k], ms[k], "%.3f");
        if (p->memory_gb != PT_UNKNOWN) {
            json_add_double(&b, "device_memory_bytes", p->memory_gb * 1e9, "%.0f");
            json_add_double(&b, "peak_bytes", peak, "%.0f");
            json_add_bool(&b, "fits", peak <= p->memory_gb * 1e9);
        }
        printf("{\"type\":\"plan_time\",%s}\n", json_fields(&b));
        json_free(&b);
        return 0;
    }
    printf("predicted step time, profile '%s' (model: docs/planner.md):\n", p->name);
    for (int r = 0; r < ranks;) {  // ranks with the same figures share a line
        const StepTime* q = &per_rank[r];
        int last = r;
        while (last + 1 < ranks && !memcmp(&per_rank[last + 1], q, sizeof(*q))) last++;
        char who[32];
        if (last > r) snprintf(who, sizeof(who), "ranks %d-%d", r, last);
        else snprintf(who, sizeof(who), "rank %d", r);
        printf("  %-10s %9.1f ms = compute %.1f (matmul %.1f, attention %.1f) + other %.1f + exposed comm %.1f "
               "(of %.1f, %.1f hidden) + bubble %.1f\n", who, q->total_ms, q->matmul_ms + q->attention_ms,
               q->matmul_ms, q->attention_ms, q->other_ms, q->exposed_ms, q->comm_ms, q->hidden_ms, q->bubble_ms);
        r = last + 1;
    }
    printf("  step %.1f ms (rank %d, the slowest): %.0f tokens/s, %.0f per rank\n", t->total_ms, slow, tps, tps / ranks);
    StepTime notes = {0};  // any rank's, not only the slowest's
    plan_time_add_notes(&notes, per_rank, ranks);
    plan_time_print_notes(&notes);
    // the plan counts the course's 4-byte floats: a bf16 run (element_bytes
    // 2) holds some categories in half of that, so over budget here is the
    // fp32 run's verdict
    if (p->memory_gb != PT_UNKNOWN) {
        double have = p->memory_gb * 1e9;
        const char* fp32 = p->element_bytes != 4 ? " (in the course's fp32 bytes)" : "";
        if (peak <= have)
            printf("device memory: fits: the fullest rank (%d) peaks at %.2f GB of the device's %.0f GB%s\n", peak_rank,
                   peak / 1e9, p->memory_gb, fp32);
        else
            printf("device memory: OVER BUDGET: the fullest rank (%d) peaks at %.2f GB, %.2f GB over the device's %.0f GB%s\n",
                   peak_rank, peak / 1e9, (peak - have) / 1e9, p->memory_gb, fp32);
    }
    return 0;
}

// ---------------------------------------------------------------- presets

int plan_time_preset(const char* name, GPTConfig* cfg) {
    // GPT-2's published sizes (vocabulary 50257, padded to 50304 as llm.c
    // pads it; 1024 positions)
    static const struct {
        const char* name;
        int L, NH, C, maxT, V, Vp;
    } presets[] = {
        {"gpt2-124m", 12, 12, 768, 1024, 50257, 50304},
        {"gpt2-350m", 24, 16, 1024, 1024, 50257, 50304},
        {"gpt2-1.5b", 48, 25, 1600, 1024, 50257, 50304},
        // Llama 3 8B's width, depth, heads, vocabulary and context in the
        // course's block (LayerNorm, a 4C GELU MLP, full multi-head
        // attention, tied embeddings, 8192 learned positions): 7.00e9 parameters against Llama's
        // 8.03e9 (its 14336-wide SwiGLU MLP, 8 KV heads, untied head)
        {"llama3-8b-like", 32, 32, 4096, 8192, 128256, 128256},
    };
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
        if (!strcmp(name, presets[i].name)) {
            *cfg = (GPTConfig){.max_seq_len = presets[i].maxT, .vocab_size = presets[i].V,
                               .padded_vocab_size = presets[i].Vp, .num_layers = presets[i].L,
                               .num_heads = presets[i].NH, .channels = presets[i].C};
            return 1;
        }
    return 0;
}

// ---------------------------------------------------------------- measuring attention

int plan_time_measure_attention(int B, int T, int C, int NH) {
    int argc = 1;
    char prog[] = "plan", *args[] = {prog, NULL}, **argv = args;
    runtime_init(&argc, &argv);
    int threads = runtime_set_threads(0);
    const char* device = device_init(runtime_local_rank());
    size_t btc = (size_t)B * T * C, bth = (size_t)B * T * NH;
    // the chapters' attention (attention_flash_*: no (B, NH, T, T) buffer):
    // qkv and dqkv, out and dout, the log-sum-exp; refused up front past the
    // device's memory (mem_alloc would end the run with an allocator's
    // message, after taking what it could)
    double need = 4.0 * (8.0 * (double)btc + (double)bth);
    if (need > (double)device_memory_bytes()) {
        fprintf(stderr, "error: --measure-attention at --batch %d --seq %d --channels %d --heads %d needs %.1f GiB "
                "(q, k, v, the output and their gradients), more than this device's %.1f GiB: lower --batch or --seq\n",
                B, T, C, NH, need / (1 << 30), (double)device_memory_bytes() / (1 << 30));
        runtime_finalize();
        return 1;
    }
    float* qkv = mem_alloc_floats(3 * btc, MEM_OTHER);
    float* dqkv = mem_alloc_floats(3 * btc, MEM_OTHER);
    float* out = mem_alloc_floats(btc, MEM_OTHER);
    float* dout = mem_alloc_floats(btc, MEM_OTHER);
    float* lse = mem_alloc_floats(bth, MEM_OTHER);
    // zeros: the softmax stays finite whatever the allocator left, and the
    // ops do the same work on any values
    ops_zero(qkv, 3 * btc);
    ops_zero(dout, btc);
    ops_zero(dqkv, 3 * btc);
    double best = 1e30;
    for (int r = 0; r < 4; r++) {  // the first warms threads and pages
        device_synchronize();
        double t0 = now_seconds();
        attention_flash_forward(out, lse, qkv, B, T, C, NH);
        attention_flash_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
        device_synchronize();
        double dt = now_seconds() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    // forward 4 T C and backward 8 T C per token and layer: gpt_flops_per_token's
    // count (the backward's recomputed scores are the op's cost, not the model's)
    double flops = 12.0 * (double)B * T * T * C;
    printf("attention_gflops = %.1f  # build/plan --measure-attention --batch %d --seq %d --channels %d "
           "--heads %d: attention_flash_forward + attention_flash_backward, best of 3, %s, %d thread(s), 12 B T^2 C "
           "flops\n",
           flops / best / 1e9, B, T, C, NH, device, threads);
    mem_free(qkv);
    mem_free(dqkv);
    mem_free(out);
    mem_free(dout);
    mem_free(lse);
    runtime_finalize();
    return 0;
}
