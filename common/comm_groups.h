// comm_groups.h: what both communication backends share about groups: the
// counter slot each group is counted in, and the MPI side of a group (each
// backend then makes its own Comm from it). Only common/cpu/comm.c,
// common/cuda/comm.c and the comm layer's own files call these; comm.h's
// comm_axis_name and comm_num_slots read the slots out.
#ifndef COMM_GROUPS_H
#define COMM_GROUPS_H

#include <mpi.h>
#include <stddef.h>

#include "mesh.h"

// The counter slot named `name`: an axis's, the world's, or a group's,
// registered at its first use (groups are created collectively, so every
// rank numbers the slots alike).
int comm_slot_for(const char* name);
// "dp+cp": the name of a group over `axes` (axes in enum order).
void comm_group_slot_name(const Mesh* mesh, unsigned axes, char* out, size_t len);
// The MPI_Comm_split colour of this rank's group over `axes`: the world rank
// of its member with coordinate 0 on every grouped axis.
int comm_group_color(const Mesh* mesh, unsigned axes);
// NULL if ranks[0..n) is a valid list of distinct world ranks, else msg.
const char* comm_check_rank_list(const int* ranks, int n, int world_size, char* msg, size_t len);
// The MPI side of a group, the same on both backends (each then makes its
// own Comm from it). Over a set of mesh axes: every rank is in one group;
// *slot gets the group's counter slot. Over listed ranks: a bad list ends
// every rank with a message; every rank registers the slot (the summary's
// slots agree), and a rank not listed gets MPI_COMM_NULL.
MPI_Comm comm_group_split_axes(const Mesh* mesh, unsigned axes, int* slot);
MPI_Comm comm_group_split_ranks(const int* ranks, int n, const char* name, int* slot);

#endif
