# collectives_busbw.gp: bus bandwidth of chapter 1's hand-written collectives
# against the library's, one panel per collective, from one bench run.
#
#   build/chapter-1 --bench --log build/bench.jsonl                       (under mpirun)
#   bash docs/plots/collectives_table.sh build/bench.jsonl build/bench.dat   (JSONL -> table)
#   gnuplot -e "datafile='build/bench.dat'; outfile='build/bench.png'" docs/plots/collectives_busbw.gp
#
# Variables (set with -e before the script name):
#   datafile  the table written by collectives_table.sh       [required]
#   outfile   the PNG to write                                 [collectives_busbw.png]
#   note      one line printed under the title (machine, caveats)   [none]
#   copybw    the memory copy bandwidth per rank in GB/s, drawn as a dashed line
#             [read from the table's "# copy_gbps" line; 0 = leave the line out]
#   ymax      the highest busbw (or copy bandwidth) of all the tables drawn
#             together, so the plots of several rank counts share one y scale
#             (plots.sh sets it) [this table's own highest]
#
# The table: op ranks bytes hand_busbw lib_busbw, one row per (op, size).

if (!exists("datafile")) {
    print "collectives_busbw.gp: set datafile, e.g. gnuplot -e \"datafile='x.dat'; outfile='x.png'\" docs/plots/collectives_busbw.gp"
    exit status 1
}
if (!exists("outfile")) outfile = "collectives_busbw.png"
if (!exists("note")) note = ""

# the copy bandwidth line of the table ("# copy_gbps 7.0098 ranks 2")
if (!exists("copybw")) {
    copystr = system("awk '$1 == \"#\" && $2 == \"copy_gbps\" { print $3; exit }' '" . datafile . "'")
    copybw = (strlen(copystr) > 0) ? real(copystr) : 0
}

# the rank count, for the title
stats datafile using 2 nooutput
ranks = int(STATS_max)

# pngcairo where gnuplot has it (antialiased), plain png otherwise
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1400,1000 font "Sans,11" noenhanced
} else {
    set terminal png size 1400,1000 font "Sans,11" noenhanced
}
set output outfile

# x: message size in bytes, log2 axis, tick labels in K/M (powers of 1024)
set logscale x 2
# the range follows the data: from 8 B to 1.5 x the largest size benched
stats datafile using 3 nooutput
set xrange [6:1.5*STATS_max]
set xtics ("8" 8, "64" 64, "512" 512, "4K" 4096, "32K" 32768, "256K" 262144, \
           "2M" 2097152, "16M" 16777216, "128M" 134217728)
set mxtics 3
set xlabel "message size (bytes; nccl-tests \"size\": the whole buffer)"

# y: bus bandwidth in GB/s (1e9 bytes per second), linear from 0
set ylabel "busbw (GB/s)"
# headroom above the highest point (and the copy line) for the legend
plotted(c) = (strcol(1) eq "allreduce_ring" || strcol(1) eq "allreduce_doubling" || \
              strcol(1) eq "reduce_scatter" || strcol(1) eq "allgather") ? column(c) : NaN
stats datafile using (plotted(4)) nooutput
ymax_hand = STATS_max
stats datafile using (plotted(5)) nooutput
ymax_own = (STATS_max > ymax_hand ? STATS_max : ymax_hand)
ymax_own = (copybw > ymax_own ? copybw : ymax_own)
if (!exists("ymax")) ymax = ymax_own
ymax = (ymax_own > ymax ? ymax_own : ymax)
set yrange [0:1.4 * ymax]
set grid xtics ytics mxtics lc rgb "#dddddd" lw 1

set key top left Left reverse box opaque samplen 3 spacing 1.1 font ",10"

# hand-written: solid blue circles; library: dashed orange squares; copy: grey
set style line 1 lc rgb "#0072B2" lw 2 pt 7 ps 0.8 dt 1
set style line 2 lc rgb "#D55E00" lw 2 pt 5 ps 0.7 dt 2
set style line 3 lc rgb "#777777" lw 1.5 dt 3

sel(name) = (strcol(1) eq name) ? $3 : NaN
copylabel = sprintf("memory copy bandwidth per rank (%.2f GB/s)", copybw)

title_top = sprintf("Chapter 1: bus bandwidth of the hand-written collectives (01_collectives/main.c) vs Open MPI, %d ranks", ranks) \
    . "\nbusbw = size / time x bus factor (nccl-tests): 2(p-1)/p for all-reduce, (p-1)/p for reduce-scatter and all-gather. Higher is better."\
    . "\nDotted line: one rank's memcpy bandwidth (64 MiB buffers, all ranks copying at once), the physical reference for large messages."
if (strlen(note) > 0) title_top = title_top . "\n" . note

set multiplot layout 2,2 title title_top font ",13" margins 0.07,0.98,0.07,0.85 spacing 0.08,0.11


set title "all-reduce, ring: reduce-scatter + all-gather, 2(p-1) steps"
plot datafile using (sel("allreduce_ring")):4 with linespoints ls 1 title "hand-written ring (comm_sendrecv + ops_add)", \
     ''       using (sel("allreduce_ring")):5 with linespoints ls 2 title "library: MPI_Allreduce", \
     (copybw > 0 ? copybw : NaN) with lines ls 3 title copylabel

set title "all-reduce, recursive doubling: log2(p) steps, whole buffer each step"
plot datafile using (sel("allreduce_doubling")):4 with linespoints ls 1 title "hand-written recursive doubling", \
     ''       using (sel("allreduce_doubling")):5 with linespoints ls 2 title "library: MPI_Allreduce", \
     (copybw > 0 ? copybw : NaN) with lines ls 3 title copylabel

set title "reduce-scatter, ring: p-1 steps"
plot datafile using (sel("reduce_scatter")):4 with linespoints ls 1 title "hand-written ring reduce-scatter", \
     ''       using (sel("reduce_scatter")):5 with linespoints ls 2 title "library: MPI_Reduce_scatter_block", \
     (copybw > 0 ? copybw : NaN) with lines ls 3 title copylabel

set title "all-gather, ring: p-1 steps"
plot datafile using (sel("allgather")):4 with linespoints ls 1 title "hand-written ring all-gather", \
     ''       using (sel("allgather")):5 with linespoints ls 2 title "library: MPI_Allgather", \
     (copybw > 0 ? copybw : NaN) with lines ls 3 title copylabel

unset multiplot
set output
