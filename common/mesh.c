// mesh.c: the device mesh over MPI ranks (see mesh.h).
#include "mesh.h"

#include <stdio.h>
#include <string.h>

#include "errors.h"

// Axes from slowest- to fastest-varying in the rank number.
static const MeshAxis rank_order[NUM_AXES] = {AXIS_PP, AXIS_DP, AXIS_EP, AXIS_CP, AXIS_TP};

const char* mesh_axis_name(MeshAxis a) {
    static const char* names[NUM_AXES] = {"dp", "tp", "pp", "cp", "ep"};
    return names[a];
}

int mesh_rank_at(const Mesh* m, const int coord[NUM_AXES]) {
    int rank = 0;
    for (int i = 0; i < NUM_AXES; i++) {
        MeshAxis a = rank_order[i];
        rank = rank * m->size[a] + coord[a];
    }
    return rank;
}

void mesh_coord_of(const Mesh* m, int rank, int coord[NUM_AXES]) {
    for (int i = NUM_AXES - 1; i >= 0; i--) {
        MeshAxis a = rank_order[i];
        coord[a] = rank % m->size[a];
        rank /= m->size[a];
    }
}

const char* mesh_create(Mesh* m, const int sizes[NUM_AXES], char* msg, size_t msg_len) {
    memset(m, 0, sizeof(*m));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &m->world_size));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &m->rank));
    // the product of the sizes, stopped before it can overflow: once it
    // passes the world size it can never equal it again
    long product = 1;
    double shown = 1.0;  // the whole product, for the message
    for (int a = 0; a < NUM_AXES; a++) {
        m->size[a] = sizes[a] > 0 ? sizes[a] : 1;
        if (product <= m->world_size) product *= m->size[a];
        shown *= m->size[a];
    }
    if (product != m->world_size) {
        char shape[128];
        mesh_describe(m, shape, sizeof(shape));
        if (product == 1)
            snprintf(msg, msg_len,
                     "the mesh is 1 rank (every axis of size 1) but mpirun started %d ranks: give axis sizes whose product is %d (--dp %d, for example) or run with -np 1",
                     m->world_size, m->world_size, m->world_size);
        else
            snprintf(msg, msg_len,
                     "the mesh %s has %.0f ranks but mpirun started %d: make the product of the axis sizes equal -np",
                     shape, shown, m->world_size);
        return msg;
    }
    mesh_coord_of(m, m->rank, m->coord);
    for (int a = 0; a < NUM_AXES; a++) {
        // the group along axis a: every rank that shares all other coordinates;
        // name it by its member with coordinate 0 on a, order it by coordinate on a
        int base[NUM_AXES];
        memcpy(base, m->coord, sizeof(base));
        base[a] = 0;
        MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, mesh_rank_at(m, base), m->coord[a], &m->axis_comm[a]));
    }
    return NULL;
}

void mesh_destroy(Mesh* m) {
    for (int a = 0; a < NUM_AXES; a++)
        if (m->axis_comm[a] != MPI_COMM_NULL && m->axis_comm[a] != 0) MPI_Comm_free(&m->axis_comm[a]);
}

void mesh_describe(const Mesh* m, char* out, size_t len) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < NUM_AXES; i++) {
        MeshAxis a = rank_order[i];
        if (m->size[a] == 1) continue;
        used += snprintf(out + used, used < len ? len - used : 0, "%s%s=%d", used ? " x " : "",
                         mesh_axis_name(a), m->size[a]);
    }
    if (used == 0) snprintf(out, len, "1 rank");
}

void mesh_print(const Mesh* m) {
    if (m->rank != 0) return;
    char shape[128];
    mesh_describe(m, shape, sizeof(shape));
    printf("mesh %s: %d rank%s\n", shape, m->world_size, m->world_size == 1 ? "" : "s");
    // the used axes in rank order; the fastest one becomes the columns
    MeshAxis used[NUM_AXES];
    int n_used = 0;
    for (int i = 0; i < NUM_AXES; i++)
        if (m->size[rank_order[i]] > 1) used[n_used++] = rank_order[i];
    if (n_used == 0) {
        printf("  rank 0 holds the whole model\n");
        fflush(stdout);
        return;
    }
    MeshAxis col = used[n_used - 1];
    int rows = m->world_size / m->size[col];
    printf("  %*s", 6 * (n_used - 1), "");
    for (int c = 0; c < m->size[col]; c++) printf("  %s=%-2d", mesh_axis_name(col), c);
    printf("\n");
    for (int r = 0; r < rows; r++) {
        int first = r * m->size[col];  // ranks of a row are consecutive
        int coord[NUM_AXES];
        mesh_coord_of(m, first, coord);
        printf("  ");
        for (int i = 0; i < n_used - 1; i++) printf("%s=%-3d", mesh_axis_name(used[i]), coord[used[i]]);
        for (int c = 0; c < m->size[col]; c++) printf("  %5d", first + c);
        printf("\n");
    }
    for (int i = 0; i < n_used; i++) {
        MeshAxis a = used[i];
        printf("  %s groups:", mesh_axis_name(a));
        for (int r = 0; r < m->world_size; r++) {
            int coord[NUM_AXES];
            mesh_coord_of(m, r, coord);
            if (coord[a] != 0) continue;  // r leads its group
            printf(" {");
            for (int k = 0; k < m->size[a]; k++) {
                coord[a] = k;
                printf(k ? ",%d" : "%d", mesh_rank_at(m, coord));
            }
            printf("}");
        }
        printf("\n");
    }
    fflush(stdout);
}
