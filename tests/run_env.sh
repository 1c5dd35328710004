#!/bin/bash
# tests/run_env.sh: the environment the course's scripted runs take: every
# test script's (tests/lib.sh sources it) and every command `make
# docs-check` runs for a quoted figure (tests/docs_check.py reads what it
# exports, once). Each setting changes how fast a run goes on a loaded
# 2-core machine, never what it prints: the messages and the numbers are the
# same (each says how that is checked). Needs BUILD (the build folder) and
# TEST_TMPDIR (a scratch folder, for the topology file); set -u safe.
# The programs' OpenMP and OpenBLAS threads sleep, rather than spin, while
# they wait for work: on a loaded machine (every rank oversubscribed, other
# jobs running) spinning threads take the cores from the threads they wait
# for, and a 10-step run took 3 to 4 times as long. The numbers are the same.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# One thread per rank unless a run says --threads (the programs take
# OMP_NUM_THREADS for --threads 0): the scripts run two at a time on the 2
# cores the course assumes, so a 1-rank run's second thread only contended
# (a 1-rank 10-step capstone run: 0.28 s of user time at 1 thread, 0.35-0.40
# at 2). The numbers are the same at any thread count (tests/unit.sh's rows
# checks; chapter 0 at 1, 2 and 4 threads in tests/chapter_0.sh).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Likewise a rank that waits for a message yields its core while it polls
# (Open MPI does that by itself only when a job has more ranks than cores):
# the tests run 2 jobs of 2 to 8 ranks at a time on 2 cores, and with ranks
# that yield two 2-rank jobs side by side took a third less CPU time and
# wall time than with ranks that spin. The messages and numbers are the same.
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
# ...and that yield is a 50 us sleep (tests/yield_sleep.c says why: ranks
# that all wait passed the core around in sched_yield calls), which
# tests/mpirun.sh preloads into the ranks when it is built (make tests);
# TEST_YIELD_SLEEP=0 runs without it. The messages and numbers are the same.
if [ "${TEST_YIELD_SLEEP:-1}" != 0 ] && [ -f "${BUILD:-build}/tests/libyield_sleep.so" ]; then
    export TEST_YIELD_SLEEP_LIB=$(cd "${BUILD:-build}/tests" && pwd)/libyield_sleep.so
fi
# mpirun and every rank read the machine's topology from one file, written
# here once per test script (tests/topology_xml.c says why: it was a third of
# the CPU time of a short job's start), once a 1-rank mpirun has started
# with it (else they discover it, as without it); TEST_TOPOLOGY_FILE=0 lets
# them discover it at each launch. The messages and numbers are the same.
if [ "${TEST_TOPOLOGY_FILE:-1}" != 0 ] && [ -z "${OMPI_MCA_hwloc_base_topo_file:-}" ] &&
   [ -x "${BUILD:-build}/tests/topology_xml" ] && "${BUILD:-build}/tests/topology_xml" "$TEST_TMPDIR/topology.xml" &&
   OMPI_MCA_hwloc_base_topo_file=$TEST_TMPDIR/topology.xml timeout 60 bash tests/mpirun.sh -np 1 true > /dev/null 2>&1; then
    export OMPI_MCA_hwloc_base_topo_file=$TEST_TMPDIR/topology.xml
fi
# Every test runs its ranks on this one machine: Open MPI's shared-memory
# transport (vader) is all they use, so it need not start and probe the
# network ones (UCX, OFI, TCP) at every launch; 4-rank 10-step runs took a
# quarter less wall time, for the same messages. (vader is Open MPI 4's name of the transport;
# Open MPI 5 takes it as another name of its sm.)
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader} OMPI_MCA_osc=${OMPI_MCA_osc:-^ucx}
