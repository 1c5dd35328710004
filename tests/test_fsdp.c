// test_fsdp.c: the FSDP engine (03_fsdp/fsdp.h) on units of odd sizes, the
// checkpoint lines of a ZeroBuffer (03_fsdp/zero_buffer.h) at every stage,
// and the training glue of common/train.h that talks across ranks. An MPI
// program: run it on any number of ranks,
//   mpirun -np 3 build/tests/test_fsdp
// Rank 0 prints the checks; each check holds only if it holds on every rank.
//   mpirun -np N build/tests/test_fsdp --check-mesh dp=2,tp=3 B T [MICRO [EXPERTS [MODEL]]]
// instead runs train_check_mesh on the MODEL preset (tiny) with that mesh,
// global batch B, sequence T, micro-batches and experts, and says "mesh ok"
// (or exits with its error).
//
// modules: 03_fsdp/fsdp 03_fsdp/zero_buffer
// run by: tests/chapter_3.sh (on MPI ranks)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "errors.h"
#include "fsdp.h"
#include "memory.h"
#include "device.h"
#include "mesh.h"
#include "rank.h"
#include "runtime.h"
#include "test.h"
#include "train.h"
#include "train_step.h"
#include "zero_buffer.h"

// ---------------------------------------------------------------- checks over every rank

static int all_ranks(int ok) {
    int all = 0;
    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    return all;
}

static double max_all(double x) {
    double m = 0.0;
    MPI_CHECK(MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return m;
}

// check() on rank 0 of what every rank saw (why: rank 0's account, or of
// every rank where the caller has combined it)
static void check_all(int ok, const char* name, const char* why) {
    ok = all_ranks(ok);
    if (world_rank() == 0) check(ok, name, "%s", why);
    else test_checks++, test_failures += !ok;
}

// ---------------------------------------------------------------- the units

#define N_UNITS 5
static const size_t unit_numel[N_UNITS] = {5, 1, 17, 8, 33};  // odd sizes: padding on most rank counts
static const int unit_own_grads[N_UNITS] = {1, 0, 0, 0, 0};

static float unit_value(int u, size_t k) { return 0.5f + (float)u + 0.01f * (float)k; }

static const char* fill_values(void* ctx, int unit, size_t lo, size_t n, float* dst, char* msg, size_t msg_len) {
    (void)msg, (void)msg_len;
    int* calls = ctx;
    (*calls)++;
    for (size_t k = 0; k < n; k++) dst[k] = unit_value(unit, lo + k);
    return NULL;
}

// The gradient rank r writes for unit u: (r + 1) times its value. The mean
// over N ranks is (N + 1) / 2 times the value.
static float grad_value(int r, int u, size_t k) { return (float)(r + 1) * unit_value(u, k); }

// Unit i as every rank sees it (host copy of N*S_i floats): the first numel
// equal want[], the padding zero. Returns the largest difference.
static double unit_diff(FSDP* f, int i, const float* want) {
    size_t padded = f->shard[i] * f->dp->size;
    float* got = xmalloc(padded * sizeof(float));
    mem_to_host(got, fsdp_unit_params(f, i), padded * sizeof(float));
    double d = 0.0;
    for (size_t k = 0; k < padded; k++) {
        double e = fabs((double)got[k] - (k < f->numel[i] ? (double)want[k] : 0.0));
        d = err_max(d, e);
    }
    free(got);
    return d;
}

static void test_engine(const Comm* dp, int zero, int prefetch, int reshard) {
    int N = dp->size, r = dp->rank;
    char name[160], why[256];
    snprintf(name, sizeof(name), "fsdp engine ZeRO-%d prefetch=%d reshard=%d on %d ranks", zero, prefetch, reshard, N);
    int fills = 0;
    FsdpSpec spec = {.n_units = N_UNITS, .numel = unit_numel, .own_grads = unit_own_grads, .fill = fill_values,
                     .fill_ctx = &fills};
    FSDP f;
    fsdp_create(&f, dp, &spec, zero, prefetch, reshard);
    size_t total = 0;
    for (int i = 0; i < N_UNITS; i++) total += unit_numel[i];

    // sizes: S_i = ceil(n_i / N), and each rank filled only its own shards
    int ok = f.n == N_UNITS && fills == N_UNITS;
    for (int i = 0; i < N_UNITS; i++) ok = ok && f.shard[i] == (unit_numel[i] + N - 1) / N;
    snprintf(why, sizeof(why), "n %d, %d fill calls, shard_total %zu", f.n, fills, f.shard_total);
    char sub[400];
    snprintf(sub, sizeof(sub), "%s: shards of ceil(n/N), one fill call per unit", name);
    check_all(ok, sub, why);

    // gathers, in forward's order with the prefetch of the next unit, then
    // in backward's: every unit arrives whole, padding zero
    float* want = xmalloc(64 * sizeof(float));
    double worst = 0.0;
    fsdp_drop_gathered(&f);
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < N_UNITS; j++) {
            int i = pass == 0 ? j : N_UNITS - 1 - j;
            for (size_t k = 0; k < unit_numel[i]; k++) want[k] = unit_value(i, k);
            fsdp_unit_params(&f, i);
            int next = pass == 0 ? i + 1 : i - 1;
            if (next >= 0 && next < N_UNITS) fsdp_prefetch(&f, next);
            double d = unit_diff(&f, i, want);
            worst = err_max(worst, d);
        }
    worst = max_all(worst);
    snprintf(sub, sizeof(sub), "%s: every unit gathers whole, padding zero", name);
    snprintf(why, sizeof(why), "max difference %g", worst);
    check_all(worst == 0.0, sub, why);

    // gradients: every rank writes its own, backward's order; the shard keeps the mean
    float* host = xmalloc(64 * sizeof(float));
    for (int i = N_UNITS - 1; i >= 0; i--) {
        float* g = fsdp_grads_begin(&f, i);
        for (size_t k = 0; k < unit_numel[i]; k++) host[k] = grad_value(r, i, k);
        mem_to_device(g, host, unit_numel[i] * sizeof(float));
        if (zero > 1) fsdp_reduce_grads(&f, i);
    }
    if (zero == 1)
        for (int i = 0; i < N_UNITS; i++) fsdp_reduce_grads(&f, i);
    float* shard = xmalloc(f.shard_total * sizeof(float));
    mem_to_host(shard, f.shard_grads, f.shard_total * sizeof(float));
    worst = 0.0;
    double sumsq_want = 0.0, range_want = 0.0;
    for (int i = 0; i < N_UNITS; i++)
        for (size_t k = 0; k < f.shard[i]; k++) {
            size_t at = (size_t)r * f.shard[i] + k;
            double mean = at < unit_numel[i] ? 0.5 * (N + 1) * unit_value(i, at) : 0.0;
            double d = fabs(shard[f.shard_off[i] + k] - mean) / (fabs(mean) + 1.0);
            worst = err_max(worst, d);
            sumsq_want += mean * mean;
            if (i == 2 && at >= 3 && at < 10) range_want += mean * mean;
        }
    worst = max_all(worst);
    snprintf(sub, sizeof(sub), "%s: reduce-scatter leaves each rank the mean of its shard", name);
    snprintf(why, sizeof(why), "max relative difference %g", worst);
    check_all(worst < 1e-6, sub, why);
    // each adds into its device double (the step's sum stays on the device)
    double sumsq = 0.0, range = 0.0;
    double* sums = train_sumsq_begin();
    fsdp_grad_sumsq(&f, sums);
    mem_to_host(&sumsq, sums, sizeof(double));
    sums = train_sumsq_begin();
    fsdp_grad_sumsq_range(&f, 2, 3, 7, sums);
    mem_to_host(&range, sums, sizeof(double));
    snprintf(sub, sizeof(sub), "%s: sum of squares of the shard, and of a range of a unit", name);
    snprintf(why, sizeof(why), "rank 0: sumsq %.9g want %.9g, range %.9g want %.9g", sumsq, sumsq_want, range,
             range_want);
    check_all(fabs(sumsq - sumsq_want) <= 1e-5 * sumsq_want && fabs(range - range_want) <= 1e-5 * (range_want + 1e-30),
              sub, why);

    // the step: the same AdamW update a single rank makes on the whole
    // (weight decay on, so padding would move if its gradient were not zero)
    AdamWConfig opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
    fsdp_step(&f, opt, 1, 0.5f);
    float* whole = mem_alloc_floats(64, MEM_OTHER);
    float* wg = mem_alloc_floats(64, MEM_OTHER);
    float* wm = mem_alloc_floats(64, MEM_OTHER);
    float* wv = mem_alloc_floats(64, MEM_OTHER);
    float* expect = xmalloc(total * sizeof(float));
    size_t off = 0;
    worst = 0.0;
    fsdp_drop_gathered(&f);
    for (int i = 0; i < N_UNITS; i++) {
        size_t n = unit_numel[i];
        for (size_t k = 0; k < n; k++) want[k] = unit_value(i, k);
        mem_to_device(whole, want, n * sizeof(float));
        for (size_t k = 0; k < n; k++) host[k] = (float)(0.5 * (N + 1)) * unit_value(i, k);
        mem_to_device(wg, host, n * sizeof(float));
        mem_zero(wm, 64 * sizeof(float));
        mem_zero(wv, 64 * sizeof(float));
        adamw_update(whole, wg, wm, wv, n, opt, 1, 0.5f);
        mem_to_host(want, whole, n * sizeof(float));
        memcpy(expect + off, want, n * sizeof(float));
        off += n;
        double d = unit_diff(&f, i, want);
        worst = err_max(worst, d);
    }
    // values below 5, where a float's ulp is 4.8e-7: the two updates may
    // round their (equal up to an ulp) gradients apart by a few ulps
    worst = max_all(worst);
    snprintf(sub, sizeof(sub), "%s: the sharded AdamW step equals the whole one, padding stays zero", name);
    snprintf(why, sizeof(why), "max difference %g", worst);
    check_all(worst < 2e-6, sub, why);

    // the whole, gathered on rank 0 without padding
    float* all = fsdp_gather_host(&f);
    worst = 0.0;
    if (r == 0)
        for (size_t k = 0; k < total; k++) worst = err_max(worst, fabs((double)all[k] - expect[k]));
    ok = (r == 0) == (all != NULL);
    snprintf(sub, sizeof(sub), "%s: gather_host concatenates the units on rank 0", name);
    snprintf(why, sizeof(why), "max difference %g, rank 0 has it: %d", worst, ok);
    check_all(ok && worst < 1e-6, sub, why);

    free(all);
    free(expect);
    free(want);
    free(host);
    free(shard);
    mem_free(whole);
    mem_free(wg);
    mem_free(wm);
    mem_free(wv);
    fsdp_free(&f);
}

// ---------------------------------------------------------------- a ZeroBuffer's checkpoint lines

// The buffer as one global tensor (tensor 0), unit by unit (ZeroBufferSlices).
static void buffer_slices(void* ctx, CkptList* out, int write, CkptKind kind, int u0, int nu, float* data) {
    const ZeroBuffer* z = ctx;
    (void)write;  // no tied copy to leave out
    for (int u = u0; u < u0 + nu; u++)
        ckpt_add(out, (CkptSlice){kind, 0, z->unit_off[u], z->unit_off[u + 1] - z->unit_off[u], 0, 1,
                                  data + (z->unit_off[u] - z->unit_off[u0])});
}

// Adds each float of l's slices to cover[kind][float]; a params float whose
// value is not the buffer's (g + 1) counts in *wrong.
static void add_cover(const CkptList* l, int* cover, size_t n, int* wrong) {
    for (int i = 0; i < l->n; i++) {
        const CkptSlice* s = &l->s[i];
        size_t nf = s->len * s->count;
        float* v = xmalloc((nf > 0 ? nf : 1) * sizeof(float));
        mem_to_host(v, s->data, nf * sizeof(float));
        for (size_t j = 0; j < s->count; j++)
            for (size_t k = 0; k < s->len; k++) {
                size_t g = s->start + j * s->stride + k;
                if (g >= n) { (*wrong)++; continue; }
                cover[(size_t)s->kind * n + g]++;
                if (s->kind == CKPT_PARAMS && v[j * s->len + k] != (float)(g + 1)) (*wrong)++;
            }
        free(v);
    }
}

// zero_buffer_ckpt: whatever the stage, the group writes every float of
// each state once (own), cut as ZeRO-1 shards what every rank holds whole,
// also when the buffer does not split evenly or is smaller than the group;
// without --zero every rank reads all of it (need).
static void test_zero_buffer_ckpt(const Comm* g) {
    static const size_t sizes[][3] = {{2, 0, 0}, {5, 1, 4}, {7, 3, 2}};  // units of each buffer (0: none)
    char name[160], why[256];
    for (int zero = 0; zero <= 3; zero++) {
        int once = 1, whole = 1, wrong = 0;
        for (int b = 0; b < 3; b++) {
            size_t numel[3], n = 0;
            int units = 0, own_grads[3] = {0};
            for (int u = 0; u < 3 && sizes[b][u]; u++) numel[units++] = sizes[b][u], n += sizes[b][u];
            ZeroBuffer z;
            zero_buffer_alloc(&z, zero, g, n);
            float* host = xmalloc(n * sizeof(float));
            for (size_t k = 0; k < n; k++) host[k] = (float)(k + 1);
            zero_buffer_put(&z, host);
            zero_buffer_units(&z, units, numel, own_grads);
            CkptList own = {0}, need = {0};
            zero_buffer_ckpt(&own, &need, &z, buffer_slices, &z);
            int* cover = xcalloc(CKPT_NUM_KINDS * n, sizeof(int));
            int* all = xcalloc(CKPT_NUM_KINDS * n, sizeof(int));
            add_cover(&own, cover, n, &wrong);
            MPI_CHECK(MPI_Allreduce(cover, all, CKPT_NUM_KINDS * (int)n, MPI_INT, MPI_SUM, g->mpi));
            for (size_t k = 0; k < CKPT_NUM_KINDS * n; k++) once = once && all[k] == 1;
            memset(cover, 0, CKPT_NUM_KINDS * n * sizeof(int));
            add_cover(&need, cover, n, &wrong);
            for (size_t k = 0; zero == 0 && k < CKPT_NUM_KINDS * n; k++) whole = whole && cover[k] == 1;
            free(cover), free(all), free(host);
            ckpt_list_free(&own), ckpt_list_free(&need);
            zero_buffer_free(&z);
        }
        snprintf(name, sizeof(name), "zero_buffer_ckpt --zero %d on %d ranks: buffers of 2, 10 and 12 floats", zero,
                 g->size);
        snprintf(why, sizeof(why), "every float written once: %d; read whole without --zero: %d; %d wrong", once,
                 whole, wrong);
        check_all(once && whole && wrong == 0, name, why);
    }
}

// zero_buffer_sumsq: the group's sum counts every float of the buffer's
// gradient once but its first `tied` (a copy of a weight another rank
// counts: the last pipeline stage's wte), wherever the tied floats end
// against the shards (--zero 1: rank r steps floats [r S, r S + S), so the
// copy may end before, inside or past a rank's shard); without --zero every
// rank holds all, and one counts it (the capstone's rule).
static void test_zero_buffer_sumsq(const Comm* g) {
    const size_t n = 23;
    char name[160], why[160];
    for (int zero = 0; zero <= 1; zero++) {
        int ok = 1;
        double worst = 0.0;
        for (size_t tied = 0; tied <= n; tied += 4) {
            ZeroBuffer z;
            zero_buffer_alloc(&z, zero, g, n);
            float* host = xcalloc(n, sizeof(float));
            zero_buffer_put(&z, host);
            zero_buffer_units(&z, 1, &n, NULL);
            z.tied = tied;
            // my shard of the reduced gradient: float i of the buffer is i + 1 (the padding past n: 0)
            float* mine_host = xcalloc(z.S, sizeof(float));
            for (size_t j = 0; j < z.S; j++) mine_host[j] = z.off + j < n ? (float)(z.off + j + 1) : 0.0f;
            mem_to_device(z.dshard, mine_host, z.S * sizeof(float));
            double* sumsq = train_sumsq_begin();
            if (zero || g->rank == 0) zero_buffer_sumsq(sumsq, &z);
            double norm = train_global_norm(sumsq, &g, 1), want = 0.0;
            for (size_t i = tied; i < n; i++) want += (double)(i + 1) * (double)(i + 1);
            double err = fabs(norm * norm - want) / (want > 0 ? want : 1.0);
            if (err > worst) worst = err;
            ok = ok && err <= 1e-12;
            free(mine_host), free(host);
            zero_buffer_free(&z);
        }
        snprintf(name, sizeof(name), "zero_buffer_sumsq --zero %d on %d ranks: 23 floats, the first 0, 4, ..., 20 tied",
                 zero, g->size);
        snprintf(why, sizeof(why), "the norm's square against the sum of squares of floats [tied, 23): worst relative "
                 "error %.2e", worst);
        check_all(ok, name, why);
    }
}

// ---------------------------------------------------------------- train.h across ranks

static void test_glue(const Mesh* mesh, const Comm* world, const Comm axes[NUM_AXES]) {
    int N = world->size, r = world->rank;
    char why[200];
    double mean = train_mean(world, r + 1.0);
    snprintf(why, sizeof(why), "got %g", mean);
    check_all(mean == 0.5 * (N + 1), "train_mean: the mean of rank+1 over the world is (N+1)/2", why);

    // the norm over the groups that together span the world: each rank's
    // share counted once. On dp x tp, over dp then tp.
    const Comm* groups[2];
    int n = 0;
    if (mesh->size[AXIS_DP] * mesh->size[AXIS_TP] == N && mesh->size[AXIS_TP] > 1) {
        groups[n++] = &axes[AXIS_DP];
        groups[n++] = &axes[AXIS_TP];
    } else {
        groups[n++] = world;
    }
    double want = 0.0;
    for (int k = 1; k <= N; k++) want += (double)k * k;
    double mine = (double)(r + 1) * (r + 1);
    double* sumsq = train_sumsq_begin();
    mem_to_device(sumsq, &mine, sizeof(double));
    comm_counts_reset();
    double norm = train_global_norm(sumsq, groups, n);
    double calls = 0.0;
    for (int a = 0; a < COMM_NUM_AXES; a++) calls += comm_count(COLL_ALLREDUCE, a).calls;
    snprintf(why, sizeof(why), "norm %.9g want %.9g, %g all-reduces for %d groups", norm, sqrt(want), calls, n);
    char name[160];
    snprintf(name, sizeof(name), "train_global_norm over %d group%s: sqrt of the sum of every rank's share, one all-reduce per group",
             n, n == 1 ? "" : "s");
    check_all(fabs(norm - sqrt(want)) <= 1e-6 * sqrt(want) && calls == n, name, why);
    mine = 16.0;
    mem_to_device(sumsq, &mine, sizeof(double));
    double alone = train_global_norm(sumsq, NULL, 0);
    snprintf(why, sizeof(why), "got %g", alone);
    check_all(alone == 4.0, "train_global_norm with no groups is sqrt(*sumsq)", why);
    AdamWConfig opt = train_adamw(&(TrainArgs){.lr = 3e-4f, .wd = 0.1f});
    snprintf(why, sizeof(why), "lr %g b1 %g b2 %g eps %g wd %g", opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay);
    check_all(opt.lr == 3e-4f && opt.beta1 == 0.9f && opt.beta2 == 0.999f && opt.eps == 1e-8f && opt.weight_decay == 0.1f,
              "train_adamw: --lr, --wd and DESIGN.md's betas and eps", why);
}

// ---------------------------------------------------------------- main

// "dp=2,tp=3" (or "dp=2 tp=3") -> sizes
static void parse_mesh(const char* s, int sizes[NUM_AXES]) {
    for (int a = 0; a < NUM_AXES; a++) sizes[a] = 1;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char* tok = strtok(buf, " ,"); tok; tok = strtok(NULL, " ,"))
        for (int a = 0; a < NUM_AXES; a++) {
            size_t len = strlen(mesh_axis_name(a));
            if (!strncmp(tok, mesh_axis_name(a), len) && tok[len] == '=') sizes[a] = atoi(tok + len + 1);
        }
}

int main(int argc, char** argv) {
    runtime_init(&argc, &argv);
    device_init(runtime_local_rank());
    int N = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &N));
    char msg[256];
    if (argc >= 5 && !strcmp(argv[1], "--check-mesh")) {
        int sizes[NUM_AXES];
        parse_mesh(argv[2], sizes);
        Mesh mesh;
        const char* bad = mesh_create(&mesh, sizes, msg, sizeof(msg));
        if (bad) fail_all("%s", bad);
        TrainSetup s;
        memset(&s, 0, sizeof(s));
        gpt_preset("tiny", &s.cfg);
        s.B = atoi(argv[3]);
        s.T = atoi(argv[4]);
        MeshNeeds needs = {.microbatches = argc > 5 ? atoi(argv[5]) : 0, .experts = argc > 6 ? atoi(argv[6]) : 0};
        if (argc > 7 && !gpt_preset(argv[7], &s.cfg)) fail_all("no preset %s", argv[7]);
        train_check_mesh(&mesh, &s, &needs);
        print0("mesh ok\n");
        mesh_destroy(&mesh);
        runtime_finalize();
        return 0;
    }
    // a dp x tp mesh when the world has 4 ranks (for the norm over two
    // groups), else dp over the world
    int sizes[NUM_AXES] = {0};
    sizes[AXIS_DP] = N == 4 ? 2 : N;
    sizes[AXIS_TP] = N == 4 ? 2 : 1;
    Mesh mesh;
    const char* bad = mesh_create(&mesh, sizes, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
    Comm world, axes[NUM_AXES];
    comm_create(&world, axes, &mesh);
    // the engine over the whole world (a dp group of N ranks)
    Comm dp = world;
    for (int zero = 1; zero <= 3; zero++) test_engine(&dp, zero, 1, 1);
    test_engine(&dp, 3, 0, 1);
    test_engine(&dp, 3, 1, 0);
    test_engine(&dp, 3, 0, 0);
    test_zero_buffer_ckpt(&dp);
    test_zero_buffer_sumsq(&dp);
    test_glue(&mesh, &world, axes);
    int all_passed = all_ranks(test_failures == 0);
    comm_destroy(&world, axes);
    mesh_destroy(&mesh);
    runtime_finalize();
    return all_passed ? test_exit_code() : 1;
}
