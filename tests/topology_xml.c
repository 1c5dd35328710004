// topology_xml.c: writes this machine's hwloc topology to an XML file, which
// tests/lib.sh hands to every mpirun of a test run
// (OMPI_MCA_hwloc_base_topo_file), so Open MPI reads the machine's cores from
// a file instead of discovering them at each launch.
//
// Why: a test run starts about a thousand MPI jobs of 1 to 16 ranks, and
// discovering the topology was a third of a short job's CPU time (an 8-rank
// job that only starts and ends: 0.31 s of CPU against 0.21 with the file,
// README.md "What keeps `make test` short"). The ranks are not bound to cores
// (tests/mpirun.sh), so the topology only tells mpirun how many cores there
// are, and the file is written on this machine at the start of the run.
//
//   build/tests/topology_xml FILE    exit 0 once FILE holds the topology
#include <hwloc.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE.xml\n", argv[0]);
        return 2;
    }
    hwloc_topology_t topology;
    if (hwloc_topology_init(&topology) != 0 || hwloc_topology_load(topology) != 0) {
        fprintf(stderr, "error: hwloc could not read this machine's topology\n");
        return 1;
    }
    // hwloc 1's format, which hwloc 2 reads too: an Open MPI built with its
    // own older hwloc reads the file the system's newer one writes
#if HWLOC_API_VERSION >= 0x00020000
    int rc = hwloc_topology_export_xml(topology, argv[1], HWLOC_TOPOLOGY_EXPORT_XML_FLAG_V1);
#else
    int rc = hwloc_topology_export_xml(topology, argv[1]);
#endif
    if (rc != 0) perror(argv[1]);
    hwloc_topology_destroy(topology);
    return rc != 0;
}
