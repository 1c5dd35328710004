// test_comm.c: communication groups over several mesh axes and over listed
// ranks, run under mpirun (tests/run.sh runs it on 4 ranks).
//
//   mpirun -np 4 build/tests/test_comm [--log FILE.jsonl] [--bad-list]
//
// On a 2x2 (dp x tp) and a 2x1x2 (dp x tp x cp) mesh, every group over every
// non-empty set of axes all-reduces 1 << world_rank from each rank: the sum
// must be the OR of exactly the ranks that share this rank's coordinates
// outside the group's axes (worked out here from mesh_coord_of, not from the
// communicator). Each group is counted in its own slot ("dp+cp"); a single
// axis in that axis's. The same holds for the non-blocking all-reduce, with
// comm_progress driving it. A group of listed ranks reduces over exactly them.
// A clock attached by comm_wait_clock_begin counts the waits until _end.
// Every check is agreed over all ranks; rank 0 prints PASS/FAIL lines.
// --bad-list: creates a group from a list with a rank twice (must end every
// rank with one message). --log: writes a summary whose "comm" has the groups.
//
// run by: tests/comm.sh (on 4 MPI ranks)
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "device.h"
#include "errors.h"
#include "memory.h"
#include "device_clock.h"
#include "mesh.h"
#include "rank.h"
#include "report.h"
#include "runtime.h"

static int failures = 0;

// One check, agreed over the world: it passes only if it passed on every rank.
static void agree(int ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void agree(int ok, const char* fmt, ...) {
    int all = 0;
    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (!all) failures++;
    if (world_rank() != 0) return;
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    if (all) printf("PASS %s\n", name);
    else printf("FAIL %s: some rank saw a wrong result (see its line above)\n", name);
    fflush(stdout);
}

// The OR of 1 << r over the world ranks r in this rank's group over axes.
static long expected_members(const Mesh* m, unsigned axes, int* count) {
    long bits = 0;
    *count = 0;
    for (int r = 0; r < m->world_size; r++) {
        int c[NUM_AXES];
        mesh_coord_of(m, r, c);
        int same = 1;
        for (int a = 0; a < NUM_AXES; a++)
            if (!(axes & (1u << a)) && c[a] != m->coord[a]) same = 0;
        if (same) {
            bits |= 1L << r;
            (*count)++;
        }
    }
    return bits;
}

static void axes_name(unsigned axes, char* out, size_t len) {
    size_t used = 0;
    out[0] = '\0';
    for (int a = 0; a < NUM_AXES; a++)
        if (axes & (1u << a)) used += snprintf(out + used, len - used, "%s%s", used ? "+" : "", mesh_axis_name(a));
}

// Every group over every non-empty set of axes of one mesh.
static void test_mesh(const int sizes[NUM_AXES], const char* shape) {
    Mesh mesh;
    char msg[256];
    const char* bad = mesh_create(&mesh, sizes, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
    float* buf = mem_alloc_floats(3, MEM_COMM);
    for (unsigned axes = 1; axes < (1u << NUM_AXES); axes++) {
        char name[64];
        axes_name(axes, name, sizeof(name));
        int members = 0;
        long want = expected_members(&mesh, axes, &members);
        Comm g;
        comm_create_group(&g, &mesh, axes);
        int single = __builtin_popcount(axes) == 1;
        int slot_ok = strcmp(comm_axis_name(g.axis), name) == 0 &&
                      (!single || g.axis == __builtin_ctz(axes)) && (single || g.axis >= COMM_NUM_AXES);
        CommCount before = comm_count(COLL_ALLREDUCE, g.axis);
        // blocking: three floats, 1 << world_rank in the middle, exact in fp32
        float mine[3] = {1.0f, (float)(1L << mesh.rank), 0.0f};
        mem_to_device(buf, mine, sizeof(mine));
        comm_allreduce(&g, buf, 3, COMM_SUM);
        float got[3];
        mem_to_host(got, buf, sizeof(got));
        int ok = g.size == members && (long)got[1] == want && (int)got[0] == members;
        // group ranks follow world-rank order: this rank's index is the
        // number of members below it
        int below = __builtin_popcountl(want & ((1L << mesh.rank) - 1));
        ok = ok && g.rank == below;
        // non-blocking: the same sum through comm_iallreduce and comm_wait
        mem_to_device(buf, mine, sizeof(mine));
        CommRequest req;
        comm_iallreduce(&g, buf, 3, COMM_SUM, &req);
        comm_progress();  // what the CPU ops call while it is in flight
        comm_wait(&req);
        mem_to_host(got, buf, sizeof(got));
        int nb_ok = (long)got[1] == want && (int)got[0] == members;
        CommCount after = comm_count(COLL_ALLREDUCE, g.axis);
        int count_ok = after.calls - before.calls == 2 && after.bytes - before.bytes == 2 * 3 * sizeof(float);
        if (!ok || !nb_ok || !slot_ok || !count_ok)
            printf("  rank %d, %s group %s: size %d rank %d (want %d, %d), sum %ld (want %ld), "
                   "non-blocking %s, slot %d '%s', counted %.0f calls %.0f bytes\n",
                   mesh.rank, shape, name, g.size, g.rank, members, below, (long)got[1], want,
                   nb_ok ? "ok" : "wrong", g.axis, comm_axis_name(g.axis), after.calls - before.calls,
                   after.bytes - before.bytes);
        agree(ok, "%s: the %s group all-reduces over exactly its %d rank(s)", shape, name, members);
        agree(nb_ok, "%s: the %s group's non-blocking all-reduce too", shape, name);
        agree(slot_ok && count_ok, "%s: the %s group is counted in slot '%s'", shape, name, name);
        comm_destroy_group(&g);
    }
    mem_free(buf);
    mesh_destroy(&mesh);
}

// A group of listed ranks: the ends of a 4-rank pipeline, listed last first.
static void test_rank_list(void) {
    int n = 0, me = world_rank();
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n));
    int ranks[2] = {n - 1, 0};
    Comm g;
    comm_create_group_ranks(&g, ranks, 2, "ends");
    int member = me == 0 || me == n - 1;
    int ok = member ? g.size == 2 && g.rank == (me == n - 1 ? 0 : 1) : g.size == 0;
    if (member) {
        float* buf = mem_alloc_floats(1, MEM_COMM);
        float mine = (float)(1L << me), got = 0.0f;
        mem_to_device(buf, &mine, sizeof(mine));
        comm_allreduce(&g, buf, 1, COMM_SUM);
        mem_to_host(&got, buf, sizeof(got));
        ok = ok && (long)got == (1L | (1L << (n - 1)));
        mem_free(buf);
    }
    int slot_ok = strcmp(comm_axis_name(g.axis), "ends") == 0 &&
                  comm_count(COLL_ALLREDUCE, g.axis).calls == (member ? 1 : 0);
    if (!ok || !slot_ok) printf("  rank %d: the ranks {%d,0} group has size %d rank %d\n", me, n - 1, g.size, g.rank);
    agree(ok, "a group of listed ranks {%d,0} reduces over exactly them, in list order; others are outside", n - 1);
    agree(slot_ok, "a group of listed ranks is counted under its name ('ends')");
    comm_destroy_group(&g);
}

// --comm hand needs chapter 1's module (01_collectives/collectives), which
// this program does not link: the comm layer refuses, naming the module,
// and keeps the library's collectives. The CUDA backend refuses --comm hand
// whatever is linked (chapter 1's algorithms run on host buffers), saying so.
static void test_hand_unlinked(void) {
    const char* msg = comm_set_impl(COMM_IMPL_HAND);
    const char* why = strcmp(device_memory_name(), "GPU memory") == 0 ? "on the CPU backend only"
                                                                      : "01_collectives/collectives";
    int ok = msg && strstr(msg, why) && !strcmp(comm_impl_name(), "library");
    if (!ok) printf("rank %d: comm_set_impl(COMM_IMPL_HAND) gave %s, impl %s\n", world_rank(), msg ? msg : "NULL",
                    comm_impl_name());
    agree(ok, "--comm hand without chapter 1's module linked: refused with a message naming it");
}

// A non-blocking COMM_AVG completed by polling comm_test (the division
// happens on completion, wherever it is seen) gives the bits of the same
// operation completed by comm_wait alone, for the all-reduce and the
// reduce-scatter, on an odd count. (Against the blocking form the bits may
// differ: MPI may reduce in another order for a non-blocking collective.)
static void test_polled_average(const Comm* world) {
    size_t n = 1001, p = (size_t)world->size;
    float* host = xmalloc(p * n * sizeof(float));
    for (size_t i = 0; i < p * n; i++) host[i] = 0.37f * (float)((i * 7 + (size_t)world->rank * 13) % 101) - 11.0f;
    float* a = mem_alloc_floats(p * n, MEM_COMM);
    float* b = mem_alloc_floats(p * n, MEM_COMM);
    float* ra = mem_alloc_floats(n, MEM_COMM);
    float* rb = mem_alloc_floats(n, MEM_COMM);
    float* ha = xmalloc(p * n * sizeof(float));
    float* hb = xmalloc(p * n * sizeof(float));
    // all-reduce
    mem_to_device(a, host, n * sizeof(float));
    mem_to_device(b, host, n * sizeof(float));
    CommRequest req;
    comm_iallreduce(world, a, n, COMM_AVG, &req);
    comm_wait(&req);
    comm_iallreduce(world, b, n, COMM_AVG, &req);
    long polls = 0;
    while (!comm_test(&req)) polls++;
    comm_wait(&req);
    mem_to_host(ha, a, n * sizeof(float));
    mem_to_host(hb, b, n * sizeof(float));
    // bitwise by construction: the same collective on the same data; only how it is completed differs
    agree(memcmp(ha, hb, n * sizeof(float)) == 0,
          "comm_iallreduce COMM_AVG completed by polling comm_test == completed by comm_wait, bitwise (%zu floats)", n);
    // reduce-scatter
    mem_to_device(a, host, p * n * sizeof(float));
    comm_ireduce_scatter(world, a, ra, n, COMM_AVG, &req);
    comm_wait(&req);
    comm_ireduce_scatter(world, a, rb, n, COMM_AVG, &req);
    while (!comm_test(&req)) polls++;
    comm_wait(&req);
    mem_to_host(ha, ra, n * sizeof(float));
    mem_to_host(hb, rb, n * sizeof(float));
    // bitwise by construction: the same collective on the same data; only how it is completed differs
    agree(memcmp(ha, hb, n * sizeof(float)) == 0,
          "comm_ireduce_scatter COMM_AVG completed by polling comm_test == completed by comm_wait, bitwise (%zu floats)", n);
    (void)polls;
    mem_free(a);
    mem_free(b);
    mem_free(ra);
    mem_free(rb);
    free(host);
    free(ha);
    free(hb);
}

// comm_ialltoallv: uneven blocks (rank i sends 3 (i + j + 1) floats to
// rank j, each float naming its source, destination and index), completed
// once by polling comm_test and once by comm_wait, against the blocking
// form and against the formula, bit for bit (a copy: no arithmetic).
static void test_ialltoallv(const Comm* world) {
    int p = world->size, me = world->rank;
    size_t *sc = xmalloc(4 * (size_t)p * sizeof(size_t)), *sd = sc + p, *rc = sc + 2 * p, *rd = sc + 3 * p;
    size_t so = 0, ro = 0;
    for (int r = 0; r < p; r++) {
        sc[r] = 3 * (size_t)(me + r + 1), sd[r] = so, so += sc[r];
        rc[r] = 3 * (size_t)(r + me + 1), rd[r] = ro, ro += rc[r];
    }
    float* host = xmalloc((so > ro ? so : ro) * sizeof(float));
    for (int r = 0; r < p; r++)
        for (size_t i = 0; i < sc[r]; i++) host[sd[r] + i] = (float)(1000 * me + 100 * r) + (float)i;
    float* send = mem_alloc_floats(so, MEM_COMM);
    float* out[3];
    for (int v = 0; v < 3; v++) out[v] = mem_alloc_floats(ro, MEM_COMM);
    mem_to_device(send, host, so * sizeof(float));
    comm_alltoallv(world, send, sc, sd, out[0], rc, rd);
    CommRequest req;
    comm_ialltoallv(world, send, sc, sd, out[1], rc, rd, &req);
    while (!comm_test(&req)) {
    }
    comm_wait(&req);
    comm_ialltoallv(world, send, sc, sd, out[2], rc, rd, &req);
    comm_wait(&req);
    int ok = 1;
    float* got = xmalloc(ro * sizeof(float));
    for (int v = 0; v < 3; v++) {
        mem_to_host(got, out[v], ro * sizeof(float));
        for (int s = 0; s < p; s++)
            for (size_t i = 0; i < rc[s]; i++) ok &= got[rd[s] + i] == (float)(1000 * s + 100 * me) + (float)i;
    }
    agree(ok, "comm_ialltoallv with uneven blocks, polled by comm_test and waited, delivers what comm_alltoallv does, "
              "every float where the counts and displacements say");
    free(got);
    for (int v = 0; v < 3; v++) mem_free(out[v]);
    mem_free(send);
    free(host);
    free(sc);
}

// comm_wait_clock_begin/_end: the waits between them count in the clock as
// in comm_wait_seconds, the waits after _end only in comm_wait_seconds. The
// clock's spans and the layer's are the same host-clock seconds on the CPU;
// on CUDA separate events recorded back to back, hence 5 us per wait.
static void test_wait_clocks(const Comm* world) {
    size_t n = 1 << 16;
    int waits = 8;
    float* buf = mem_alloc_floats(n, MEM_COMM);
    DeviceClock c = {0};
    double w0 = comm_wait_seconds();
    comm_wait_clock_begin(&c);
    for (int i = 0; i < waits; i++) comm_allreduce(world, buf, n, COMM_SUM);
    comm_wait_clock_end(&c);
    double inside = device_clock_seconds(&c), w1 = comm_wait_seconds();
    for (int i = 0; i < waits; i++) comm_allreduce(world, buf, n, COMM_SUM);
    double after = device_clock_seconds(&c), w2 = comm_wait_seconds();
    double tol = 1e-9 + waits * 5e-6;
    int ok = inside > 0 && inside - (w1 - w0) <= tol && (w1 - w0) - inside <= tol;
    if (!ok) fprintf(stderr, "[rank %d] clock %.9f s, comm_wait_seconds %.9f s\n", world->rank, inside, w1 - w0);
    agree(ok, "comm_wait_clock_begin/_end: %d all-reduces' waits in the clock == in comm_wait_seconds (within %.0f us)",
          waits, tol * 1e6);
    ok = after == inside && w2 > w1;
    if (!ok) fprintf(stderr, "[rank %d] after _end: clock %.9f -> %.9f s, comm_wait_seconds +%.9f s\n", world->rank,
                     inside, after, w2 - w1);
    agree(ok, "after comm_wait_clock_end the waits count in comm_wait_seconds only");
    device_clock_free(&c);
    mem_free(buf);
}

int main(int argc, char** argv) {
    runtime_init(&argc, &argv);
    const char* log_path = NULL;
    const char* short_message = NULL;
    int bad_list = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--log") && i + 1 < argc) log_path = argv[++i];
        else if (!strcmp(argv[i], "--bad-list")) bad_list = 1;
        else if (!strcmp(argv[i], "--short-message") && i + 1 < argc) short_message = argv[++i];
        else fail_all("test_comm: unknown argument '%s' (takes --log FILE, --bad-list, --short-message recv|sendrecv|irecv)",
                      argv[i]);
    }
    int n = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n));
    if (n != 4) fail_all("test_comm runs on 4 ranks (mpirun -np 4), not %d", n);
    runtime_set_threads(1);
    device_init(runtime_local_rank());
    Comm world;
    comm_create(&world, NULL, NULL);
    if (bad_list) {
        int ranks[3] = {0, 2, 0};
        Comm g;
        comm_create_group_ranks(&g, ranks, 3, "bad");  // must not return
        fail_all("test_comm --bad-list: a list with rank 0 twice was accepted");
    }
    if (short_message) {
        // rank 0 sends 3 floats where rank 1 posted a receive of 4: NCCL
        // would not match them, so the CPU backend ends the job (comm.c's
        // check_received) instead of taking the short message
        float* buf = mem_alloc_floats(4, MEM_OTHER);
        int mode = !strcmp(short_message, "recv") ? 0 : !strcmp(short_message, "sendrecv") ? 1 : 2;
        if (world.rank == 0 && mode == 1) comm_sendrecv(&world, buf, 3, 1, buf, 3, 1);
        else if (world.rank == 0) comm_send(&world, buf, 3, 1);
        if (world.rank == 1 && mode == 0) comm_recv(&world, buf, 4, 0);
        if (world.rank == 1 && mode == 1) comm_sendrecv(&world, buf, 3, 0, buf, 4, 0);
        if (world.rank == 1 && mode == 2) {
            CommRequest req;
            comm_irecv(&world, buf, 4, 0, &req);
            comm_wait(&req);
        }
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        fail_all("test_comm --short-message %s: a message shorter than its receive was taken", short_message);
    }
    comm_counts_reset();
    test_mesh((const int[NUM_AXES]){[AXIS_DP] = 2, [AXIS_TP] = 2}, "dp=2 x tp=2");
    test_mesh((const int[NUM_AXES]){[AXIS_DP] = 2, [AXIS_TP] = 1, [AXIS_CP] = 2}, "dp=2 x tp=1 x cp=2");
    test_rank_list();
    test_polled_average(&world);
    test_ialltoallv(&world);
    test_wait_clocks(&world);
    test_hand_unlinked();

    // the summary: every group's slot is a key of "comm" beside the axes
    if (log_path) {
        JsonLog log;
        char msg[256];
        const char* bad = jsonl_open(&log, log_path, msg, sizeof(msg));
        fail_if_any(bad != NULL, bad);
        Mesh mesh;
        const char* mbad = mesh_create(&mesh, (const int[NUM_AXES]){[AXIS_DP] = 2, [AXIS_CP] = 2}, msg, sizeof(msg));
        if (mbad) fail_all("%s", mbad);
        RunSummary s = {.chapter = -1, .model = "none", .val_loss = -1.0f};
        report_summary(&log, &mesh, &s);
        jsonl_close(&log);
        mesh_destroy(&mesh);
    }
    comm_destroy(&world, NULL);
    runtime_finalize();
    return failures ? 1 : 0;
}
