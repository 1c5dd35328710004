# memory.gp: peak memory per rank by category, one stacked bar per run.
#
#   gnuplot -e "dir='build/plots'; outfile='docs/plots/memory_per_rank.png'" docs/plots/memory.gp
#
# Reads dir/memory.dat (docs/plots/extract.sh): x rank params grads optimizer
# activations comm other total label, in MiB. The bar stacks each category's
# own peak; "total" (a black dash) is the peak of the sum, which is lower when
# categories peak at different moments. A run whose ranks hold different
# amounts has a second bar: the rank that differs most from rank 0.
# One row per bar (rows.gpi): the picture's height follows the number of runs.
# Two panels side by side: everything the rank holds (activations dominate
# it), and the model state alone (params + grads + optimizer), which is what
# ZeRO shards. The figures are exact counts of the tracking allocator, the
# same on every run, so the sweep's note on machine load (variable note) is
# not printed; mixed (plots.sh, from sweep.txt) says when runs were made at
# different times, which does not change them.

if (!exists("dir")) dir = "build/plots"
if (!exists("outfile")) outfile = "docs/plots/memory_per_rank.png"
if (!exists("mixed")) mixed = ""
f = dir . "/memory.dat"
load system("dirname '" . ARG0 . "'") . "/rows.gpi"

# one row per bar, a free row above each chapter for its name: the picture
# grows with the rows, row_px pixels a row
stats f using 1 nooutput
row_first = STATS_min - 1
row_last = STATS_max
nrows = row_last - row_first + 1
# the panels' widths (before any range is set: stats honours them)
stats f using ($3 + $4 + $5 + $6 + $7 + $8) nooutput
max_all = STATS_max
stats f using ($3 + $4 + $5) nooutput
max_state = STATS_max
top_px = 140 + (strlen(mixed) > 0 ? 48 : 0)
bottom_px = 175
height = top_px + nrows * row_px + bottom_px
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1900,height font "Sans,11" noenhanced
} else {
    set terminal png size 1900,height font "Sans,11" noenhanced
}
set output outfile

t = "Peak memory per rank, by what it holds (stacked), for every run of the sweep: lower is better"
t = t . "\nData parallel (ch2) copies everything on every rank; ZeRO (ch3) shards optimizer state, then gradients, then parameters over dp"
t = t . "\nExact counts of the tracking allocator (MiB = 2^20 bytes): the same on every run of the same command"
if (strlen(mixed) > 0) t = t . ", whatever the load\n" . wrap_mixed(mixed)
set multiplot title t font ",13"

set yrange [row_last + 0.7 : row_first - 0.7]
set ytics nomirror font ",9" scale 0
set xtics nomirror
set grid xtics lc rgb "#dddddd"
set style fill solid 0.9 border rgb "#333333"
# the same top and bottom edges in both panels, so the rows line up; one
# legend at the bottom of the picture, clear of the bars
set tmargin at screen 1.0 - (top_px - 10.0) / height
set bmargin at screen 1.0 * bottom_px / height

# columns 3..8 are params grads optimizer activations comm other: band k
# runs from the sum of columns 3..k-1 to the sum of columns 3..k
upto(k) = (k < 3) ? 0 : sum [c = 3:k] column(c)
names = "params grads optimizer activations comm other"
colors = "#0072B2 #56B4E9 #009E73 #E69F00 #D55E00 #999999"

# ---------------------------------------------------------------- left: everything
set lmargin at screen 0.19
set rmargin at screen 0.575
set title "everything the rank holds: the model state\nplus activations and communication buffers" font ",11"
set xrange [0 : 1.12 * max_all]
set xlabel "peak MiB per rank"
set key at screen 0.5, screen 0.008 center bottom horizontal maxrows 1 box opaque samplen 2 width 1 \
    title "what the memory holds (left to right; the right panel uses the same colours); black line: peak of the sum, left of the bar's end when categories peak at different times"
plot f using (0):1:ytic(10) with points ps 0 notitle, \
     for [k = 3:8] f using ((upto(k - 1) + upto(k)) / 2):1:((upto(k) - upto(k - 1)) / 2):(0.38) \
         with boxxyerror fs solid 0.9 border rgb "#333333" lc rgb word(colors, k - 2) \
         title (k == 7 ? "comm buffers" : word(names, k - 2)), \
     f using 9:($1 - 0.4):(0):(0.8) with vectors nohead lw 3 lc rgb "black" \
         title "peak of the sum", \
     f using (upto(8)):1:(sprintf("%.0f", upto(8))) with labels left offset 0.5,0 font ",9" notitle, \
     headers(f) using (0):1:(chname($2)):(chcolor($2)) with labels left offset 0.3,0 \
         font "Sans Bold,10" tc rgb variable notitle

# ---------------------------------------------------------------- right: model state
set lmargin at screen 0.61
set rmargin at screen 0.985
set title "the model state alone: params + grads + optimizer\n(AdamW's two moments), without activations" font ",11"
set xrange [0 : 1.12 * max_state]
set ytics format ""
unset key
plot for [k = 3:5] f using ((upto(k - 1) + upto(k)) / 2):1:((upto(k) - upto(k - 1)) / 2):(0.38) \
         with boxxyerror fs solid 0.9 border rgb "#333333" lc rgb word(colors, k - 2) notitle, \
     f using (upto(5)):1:(sprintf("%.1f", upto(5))) with labels left offset 0.5,0 font ",9" notitle, \
     headers(f) using (0):1:(chname($2)):(chcolor($2)) with labels left offset 0.3,0 \
         font "Sans Bold,10" tc rgb variable notitle
unset multiplot
set output
