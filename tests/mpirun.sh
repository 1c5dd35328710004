#!/bin/bash
# mpirun the way the course's scripts run it: more ranks than cores allowed
# (a 2-core laptop runs 4 ranks), and as root when the machine is a container
# or a CI runner, which Open MPI refuses unless told. Ranks are not bound to
# one core each, so a rank's threads can use its share of the node (the
# programs pick cores / ranks-per-node threads).
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# The test scripts' ranks yield by sleeping (tests/lib.sh sets
# TEST_YIELD_SLEEP_LIB; tests/yield_sleep.c says why).
if [ -n "${TEST_YIELD_SLEEP_LIB:-}" ]; then
    export LD_PRELOAD=$TEST_YIELD_SLEEP_LIB${LD_PRELOAD:+:$LD_PRELOAD}
fi
exec mpirun --oversubscribe --bind-to none "$@"
