// comm_groups.c: the counter slots and the MPI side of groups, shared by
// both communication backends (comm_groups.h).
#include "comm_groups.h"

#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "errors.h"
#include "rank.h"

// the slots after the axes' and the world's: one per kind of group
#define SLOT_NAME_LEN 48
static char group_slot_names[COMM_MAX_SLOTS - COMM_NUM_AXES][SLOT_NAME_LEN];
static int num_group_slots = 0;

const char* comm_axis_name(int axis) {
    if (axis >= COMM_NUM_AXES) return group_slot_names[axis - COMM_NUM_AXES];
    return axis == COMM_WORLD_AXIS ? "world" : mesh_axis_name((MeshAxis)axis);
}

int comm_num_slots(void) { return COMM_NUM_AXES + num_group_slots; }

int comm_slot_for(const char* name) {
    for (int a = 0; a < comm_num_slots(); a++)
        if (strcmp(comm_axis_name(a), name) == 0) return a;
    CHECK(num_group_slots < COMM_MAX_SLOTS - COMM_NUM_AXES,
          "more than %d kinds of communication group: raise COMM_MAX_SLOTS in comm.h",
          COMM_MAX_SLOTS - COMM_NUM_AXES);
    CHECK(strlen(name) < SLOT_NAME_LEN, "group name '%s' is longer than %d characters", name, SLOT_NAME_LEN - 1);
    strcpy(group_slot_names[num_group_slots], name);
    return COMM_NUM_AXES + num_group_slots++;
}

void comm_group_slot_name(const Mesh* mesh, unsigned axes, char* out, size_t len) {
    (void)mesh;
    size_t used = 0;
    out[0] = '\0';
    for (int a = 0; a < NUM_AXES; a++)
        if (axes & (1u << a))
            used += snprintf(out + used, used < len ? len - used : 0, "%s%s", used ? "+" : "",
                             mesh_axis_name((MeshAxis)a));
}

int comm_group_color(const Mesh* mesh, unsigned axes) {
    // the group's member with coordinate 0 on every grouped axis names it
    int base[NUM_AXES];
    for (int a = 0; a < NUM_AXES; a++) base[a] = (axes & (1u << a)) ? 0 : mesh->coord[a];
    return mesh_rank_at(mesh, base);
}

const char* comm_check_rank_list(const int* ranks, int n, int world_size, char* msg, size_t len) {
    if (n < 1 || !ranks) {
        snprintf(msg, len, "comm_create_group_ranks: the list of ranks is empty");
        return msg;
    }
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= world_size) {
            snprintf(msg, len, "comm_create_group_ranks: rank %d is not in a world of %d ranks", ranks[i], world_size);
            return msg;
        }
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) {
                snprintf(msg, len, "comm_create_group_ranks: rank %d is listed twice", ranks[i]);
                return msg;
            }
    }
    return NULL;
}

MPI_Comm comm_group_split_axes(const Mesh* mesh, unsigned axes, int* slot) {
    CHECK(axes != 0 && axes < (1u << NUM_AXES), "comm_create_group: 0x%x is not a set of mesh axes", axes);
    char name[64];
    comm_group_slot_name(mesh, axes, name, sizeof(name));
    *slot = comm_slot_for(name);
    MPI_Comm mpi;
    // key: the world rank, so group ranks follow the mesh's rank order
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, comm_group_color(mesh, axes), mesh->rank, &mpi));
    return mpi;
}

MPI_Comm comm_group_split_ranks(const int* ranks, int n, const char* name, int* slot) {
    int world_size = 1, me = world_rank();
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    char msg[256];
    const char* bad = comm_check_rank_list(ranks, n, world_size, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);  // the same list, so the same verdict, on every rank
    int index = -1;
    for (int i = 0; i < n; i++)
        if (ranks[i] == me) index = i;
    MPI_Comm mpi;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, index >= 0 ? 0 : MPI_UNDEFINED, index, &mpi));
    *slot = comm_slot_for(name);
    return mpi;
}
