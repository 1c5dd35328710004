# comm_bytes.gp: what every run communicates per training step, per rank, by
# collective (stacked bars), and the bus bytes those calls put on the wire.
#
#   gnuplot -e "dir='build/plots'; outfile='docs/plots/comm_bytes_per_step.png'" docs/plots/comm_bytes.gp
#
# Reads dir/comm.dat (docs/plots/extract.sh): x, then MiB per step for rank 0
# for allreduce reduce_scatter allgather broadcast reduce scatter gather
# alltoall send recv (columns 2..11), the bus MiB per step (12), label (13).
# One row per run (rows.gpi): the picture's height follows the number of runs.
# The figures are exact counts of the comm layer, the same on every run, so
# the sweep's note on machine load (variable note) is not printed; mixed
# (plots.sh, from sweep.txt) says when runs were made at different times.

if (!exists("dir")) dir = "build/plots"
if (!exists("outfile")) outfile = "docs/plots/comm_bytes_per_step.png"
if (!exists("mixed")) mixed = ""
f = dir . "/comm.dat"
load system("dirname '" . ARG0 . "'") . "/rows.gpi"

# one row per run, a free row above each chapter for its name: the picture
# grows with the runs, row_px pixels a row
stats f using 1 nooutput
row_first = STATS_min - 1
row_last = STATS_max
nrows = row_last - row_first + 1
# the width (before any range is set: stats honours them)
stats f using ((sum [c = 2:11] column(c)) > $12 ? (sum [c = 2:11] column(c)) : $12) nooutput
xmax = STATS_max > 0 ? STATS_max : 1
top_px = 115 + (strlen(mixed) > 0 ? 40 : 0)
bottom_px = 150
height = top_px + nrows * row_px + bottom_px
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1700,height font "Sans,11" noenhanced
} else {
    set terminal png size 1700,height font "Sans,11" noenhanced
}
set output outfile

t = "Communication per training step and rank (rank 0), by collective: the size of the buffers the calls work on (comm counters' \"bytes\" / steps)"
t = t . "\nBlack diamond: the bus bytes of the same calls, what a bandwidth-optimal algorithm sends per rank\n(all-reduce 2(p-1)/p x size, reduce-scatter and all-gather (p-1)/p)"
t = t . "\nExact counts of the comm layer's counters: the same on every run of the same command, whatever the load"
if (strlen(mixed) > 0) t = t . "\n" . wrap_mixed(mixed)
set multiplot title t font ",12"

set lmargin at screen 0.19
set rmargin at screen 0.98
set tmargin at screen 1.0 - (top_px - 10.0) / height
set bmargin at screen 1.0 * bottom_px / height
set xrange [0 : 1.15 * xmax]
set yrange [row_last + 0.7 : row_first - 0.7]
set xlabel "MiB per step per rank (MiB = 2^20 bytes)"
set ytics nomirror font ",9" scale 0
set xtics nomirror
set grid xtics lc rgb "#dddddd"
set key at screen 0.585, screen 0.01 center bottom horizontal maxrows 2 box opaque samplen 2 spacing 1.1 width 1
set style fill solid 0.9 border rgb "#333333"

names = "all-reduce reduce-scatter all-gather broadcast reduce scatter gather all-to-all send recv"
colors = "#0072B2 #009E73 #56B4E9 #E69F00 #D55E00 #CC79A7 #F0E442 #999999 #444444 #BBBBBB"
# the collectives some run used (columns 2..11 with a non-zero total)
used = system("awk '!/^#/ && NF { for (c = 2; c <= 11; c++) s[c] += $c } END { for (c = 2; c <= 11; c++) if (s[c] > 0) printf \"%d \", c }' '" . f . "'")
n = words(used)
upto(i) = (i < 1) ? 0 : sum [j = 1:i] column(int(word(used, j)))
hdr = headers(f) . ""

# stacked left to right in the order of the columns; the legend in that order
if (n > 0) {
    plot f using (0):1:ytic(13) with points ps 0 notitle, \
         for [i = 1:n] f using ((upto(i - 1) + upto(i)) / 2):1:((upto(i) - upto(i - 1)) / 2):(0.38) \
             with boxxyerror lc rgb word(colors, int(word(used, i)) - 1) \
             title word(names, int(word(used, i)) - 1), \
         f using 12:1 with points pt 13 ps 1.6 lc rgb "black" title "bus bytes per step (all collectives)", \
         f using (upto(n)):1:(sprintf("%.1f", upto(n))) with labels left offset 1.6,0 font ",9" notitle, \
         hdr using (0):1:(chname($2)):(chcolor($2)) with labels left offset 0.3,0 \
             font "Sans Bold,10" tc rgb variable notitle
} else {
    plot f using (0):1:ytic(13) with points ps 0 notitle, \
         f using 12:1 with points pt 13 ps 1.6 lc rgb "black" title "bus bytes per step (no run communicated)", \
         hdr using (0):1:(chname($2)):(chcolor($2)) with labels left offset 0.3,0 \
             font "Sans Bold,10" tc rgb variable notitle
}
unset multiplot
set output
