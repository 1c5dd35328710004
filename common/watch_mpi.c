// watch_mpi.c: every blocking MPI call the main thread makes is a wait the
// watchdog watches (watchdog.h), wherever in the program it is made.
//
// comm.c marks the calls of the comm layer with their collective and group
// ("allreduce on dp"). Plain MPI calls on host scalars (a loss's mean, a
// checkpoint's "every writer done?", a stage's loss broadcast) used to go
// unmarked: a rank stopped while its peer sat in one of them hung the job
// forever, the one thing the watchdog exists to prevent. Rather than mark
// each call site (and miss the next one written), this file uses MPI's
// profiling interface (the MPI standard, "Profiling Interface"): every
// MPI_X is also callable as PMPI_X, so a program may define its own MPI_X
// that does something around PMPI_X. mpiP and Score-P work this way.
//
// Only the thread that started the watchdog is marked: the checkpoint
// writer makes MPI calls of its own, and the marks count one thread's
// nesting (the census thread calls PMPI_ directly and never comes here).
// Inside a comm.c mark the outer name wins.
#include "watchdog.h"

#include <mpi.h>

static const char* group_of(MPI_Comm comm) { return comm == MPI_COMM_WORLD ? "world" : "an MPI sub-group"; }

int MPI_Barrier(MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Barrier", group_of(comm), -1);
    int rc = PMPI_Barrier(comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Bcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Bcast", group_of(comm), -1);
    int rc = PMPI_Bcast(buf, count, type, root, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Allreduce", group_of(comm), -1);
    int rc = PMPI_Allreduce(send, recv, count, type, op, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Reduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, int root, MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Reduce", group_of(comm), -1);
    int rc = PMPI_Reduce(send, recv, count, type, op, root, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Reduce_scatter_block(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Reduce_scatter_block", group_of(comm), -1);
    int rc = PMPI_Reduce_scatter_block(send, recv, count, type, op, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Exscan(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Exscan", group_of(comm), -1);
    int rc = PMPI_Exscan(send, recv, count, type, op, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Gather(const void* send, int scount, MPI_Datatype stype, void* recv, int rcount, MPI_Datatype rtype, int root,
               MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Gather", group_of(comm), -1);
    int rc = PMPI_Gather(send, scount, stype, recv, rcount, rtype, root, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Gatherv(const void* send, int scount, MPI_Datatype stype, void* recv, const int rcounts[], const int displs[],
                MPI_Datatype rtype, int root, MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Gatherv", group_of(comm), -1);
    int rc = PMPI_Gatherv(send, scount, stype, recv, rcounts, displs, rtype, root, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Scatter(const void* send, int scount, MPI_Datatype stype, void* recv, int rcount, MPI_Datatype rtype, int root,
                MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Scatter", group_of(comm), -1);
    int rc = PMPI_Scatter(send, scount, stype, recv, rcount, rtype, root, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Allgather(const void* send, int scount, MPI_Datatype stype, void* recv, int rcount, MPI_Datatype rtype,
                  MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Allgather", group_of(comm), -1);
    int rc = PMPI_Allgather(send, scount, stype, recv, rcount, rtype, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Allgatherv(const void* send, int scount, MPI_Datatype stype, void* recv, const int rcounts[], const int displs[],
                   MPI_Datatype rtype, MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Allgatherv", group_of(comm), -1);
    int rc = PMPI_Allgatherv(send, scount, stype, recv, rcounts, displs, rtype, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Alltoall(const void* send, int scount, MPI_Datatype stype, void* recv, int rcount, MPI_Datatype rtype,
                 MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Alltoall", group_of(comm), -1);
    int rc = PMPI_Alltoall(send, scount, stype, recv, rcount, rtype, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Alltoallv(const void* send, const int scounts[], const int sdispls[], MPI_Datatype stype, void* recv,
                  const int rcounts[], const int rdispls[], MPI_Datatype rtype, MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Alltoallv", group_of(comm), -1);
    int rc = PMPI_Alltoallv(send, scounts, sdispls, stype, recv, rcounts, rdispls, rtype, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Send(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
    int marked = watchdog_enter_mpi("MPI_Send", group_of(comm), dest);
    int rc = PMPI_Send(buf, count, type, dest, tag, comm);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Status* status) {
    int marked = watchdog_enter_mpi("MPI_Recv", group_of(comm), source);
    int rc = PMPI_Recv(buf, count, type, source, tag, comm, status);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Sendrecv(const void* send, int scount, MPI_Datatype stype, int dest, int stag, void* recv, int rcount,
                 MPI_Datatype rtype, int source, int rtag, MPI_Comm comm, MPI_Status* status) {
    int marked = watchdog_enter_mpi("MPI_Sendrecv", group_of(comm), source);
    int rc = PMPI_Sendrecv(send, scount, stype, dest, stag, recv, rcount, rtype, source, rtag, comm, status);
    watchdog_leave_mpi(marked);
    return rc;
}

// A new communicator needs every member's colour or key: a collective that
// blocks like any other (the capstone makes its groups after the watchdog starts).
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* out) {
    int marked = watchdog_enter_mpi("MPI_Comm_split", group_of(comm), -1);
    int rc = PMPI_Comm_split(comm, color, key, out);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info, MPI_Comm* out) {
    int marked = watchdog_enter_mpi("MPI_Comm_split_type", group_of(comm), -1);
    int rc = PMPI_Comm_split_type(comm, type, key, info, out);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* out) {
    int marked = watchdog_enter_mpi("MPI_Comm_dup", group_of(comm), -1);
    int rc = PMPI_Comm_dup(comm, out);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Wait(MPI_Request* req, MPI_Status* status) {
    int marked = watchdog_enter_mpi("MPI_Wait", "a request", -1);
    int rc = PMPI_Wait(req, status);
    watchdog_leave_mpi(marked);
    return rc;
}

int MPI_Waitall(int n, MPI_Request reqs[], MPI_Status statuses[]) {
    int marked = watchdog_enter_mpi("MPI_Waitall", "requests", -1);
    int rc = PMPI_Waitall(n, reqs, statuses);
    watchdog_leave_mpi(marked);
    return rc;
}
