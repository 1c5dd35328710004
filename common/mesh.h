// mesh.h: the device mesh, an N-dimensional grid of MPI ranks with named axes.
//
// Each rank sits at one coordinate per axis. Ranks that differ only in their
// coordinate along axis a form a group, and each group gets its own
// communicator: a data-parallel all-reduce runs in the dp communicator, a
// tensor-parallel all-reduce in the tp one, and so on.
//
// Rank order (which axis varies fastest): tp, then cp, ep, dp, pp (Megatron's
// order): tensor-parallel partners are neighbouring ranks, so they land on the
// same node, where bandwidth is highest; pipeline stages are farthest apart.
#ifndef MESH_H
#define MESH_H

#include <mpi.h>
#include <stddef.h>

typedef enum { AXIS_DP, AXIS_TP, AXIS_PP, AXIS_CP, AXIS_EP, NUM_AXES } MeshAxis;

typedef struct {
    int world_size, rank;
    int size[NUM_AXES];       // extent of each axis (1 if unused)
    int coord[NUM_AXES];      // this rank's coordinate on each axis
    MPI_Comm axis_comm[NUM_AXES];  // this rank's group along each axis
} Mesh;

const char* mesh_axis_name(MeshAxis a);  // "dp", "tp", "pp", "cp", "ep"

// Builds the mesh over MPI_COMM_WORLD. sizes[a] <= 0 means 1. Collective.
// Returns NULL, or (on every rank alike) a message when the product of the
// sizes is not the world size.
const char* mesh_create(Mesh* m, const int sizes[NUM_AXES], char* msg, size_t msg_len);
void mesh_destroy(Mesh* m);

// The world rank at a coordinate, and the coordinate of a world rank.
int mesh_rank_at(const Mesh* m, const int coord[NUM_AXES]);
void mesh_coord_of(const Mesh* m, int rank, int coord[NUM_AXES]);

// Rank 0 prints the mesh as a picture: which rank sits where, and the groups
// along every axis of size > 1.
void mesh_print(const Mesh* m);

// "dp=2 tp=2" style description of the axes of size > 1 ("1 rank" if none).
void mesh_describe(const Mesh* m, char* out, size_t len);

#endif
