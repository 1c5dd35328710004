# comm_bytes.gp: what every run communicates per training step, per rank, by
# collective (stacked bars), and the bus bytes those calls put on the wire.
#
#   gnuplot -e "dir='build/plots'; outfile='docs/plots/comm_bytes_per_step.png'" docs/plots/comm_bytes.gp
#
# Reads dir/comm.dat (docs/plots/extract.sh): x, then MiB per step for rank 0
# for allreduce reduce_scatter allgather broadcast reduce scatter gather
# alltoall send recv (columns 2..11), the bus MiB per step (12), label (13).
# The figures are exact counts of the comm layer, the same on every run, so
# the sweep's note on machine load (variable note) is not printed.

if (!exists("dir")) dir = "build/plots"
if (!exists("outfile")) outfile = "docs/plots/comm_bytes_per_step.png"
f = dir . "/comm.dat"

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1800,950 font "Sans,11" noenhanced
} else {
    set terminal png size 1800,950 font "Sans,11" noenhanced
}
set output outfile

t = "Communication per training step and rank (rank 0), by collective: the size of the buffers the calls work on (comm counters' \"bytes\" / steps)"
t = t . "\nBlack diamond: the bus bytes of the same calls, what a bandwidth-optimal algorithm sends per rank (all-reduce 2(p-1)/p x size, reduce-scatter and all-gather (p-1)/p)"
t = t . "\nExact counts of the comm layer's counters: the same on every run of the same command"
set title t font ",12"

stats f using 1 nooutput
set xrange [STATS_min - 0.7 : STATS_max + 0.7]
stats f using ((sum [c = 2:11] column(c)) > $12 ? (sum [c = 2:11] column(c)) : $12) nooutput
ymax = STATS_max > 0 ? STATS_max : 1
set yrange [0 : 1.2 * ymax]
set ylabel "MiB per step per rank (MiB = 2^20 bytes)"
set xlabel "run (chapter, strategy, mesh, global batch in sequences)" offset 0,-3.2
set bmargin 11
set xtics nomirror font ",9" scale 0
set grid ytics lc rgb "#dddddd"
set key below box opaque invert samplen 2 spacing 1.1
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.8

names = "all-reduce reduce-scatter all-gather broadcast reduce scatter gather all-to-all send recv"
colors = "#0072B2 #009E73 #56B4E9 #E69F00 #D55E00 #CC79A7 #F0E442 #999999 #444444 #BBBBBB"
# the collectives some run used (columns 2..11 with a non-zero total)
used = system("awk '!/^#/ && NF { for (c = 2; c <= 11; c++) s[c] += $c } END { for (c = 2; c <= 11; c++) if (s[c] > 0) printf \"%d \", c }' '" . f . "'")
n = words(used)
upto(i) = sum [j = 1:i] column(int(word(used, j)))

if (n > 0) {
    plot f using 1:(0):xtic(13) with points ps 0 notitle, \
         for [i = n:1:-1] f using 1:(upto(i)) with boxes lc rgb word(colors, int(word(used, i)) - 1) \
             title word(names, int(word(used, i)) - 1), \
         f using 1:12 with points pt 13 ps 1.8 lc rgb "black" title "bus bytes per step (all collectives)", \
         f using 1:(upto(n)):(sprintf("%.1f", upto(n))) with labels offset 0,0.8 font ",9" notitle
} else {
    plot f using 1:(0):xtic(13) with points ps 0 notitle, \
         f using 1:12 with points pt 13 ps 1.8 lc rgb "black" title "bus bytes per step (no run communicated)"
}
set output
