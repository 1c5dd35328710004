# memory.gp: peak memory per rank by category, one stacked bar per run.
#
#   gnuplot -e "dir='build/plots'; outfile='docs/plots/memory_per_rank.png'" docs/plots/memory.gp
#
# Reads dir/memory.dat (docs/plots/extract.sh): x rank params grads optimizer
# activations comm other total label, in MiB. The bar stacks each category's
# own peak; "total" (a black dash) is the peak of the sum, which is lower when
# categories peak at different moments. A run whose ranks hold different
# amounts has a second bar: the rank that differs most from rank 0.
# Two panels: everything the rank holds (activations dominate it), and the
# model state alone (params + grads + optimizer), which is what ZeRO shards.
# The figures are exact counts of the tracking allocator, the same on every
# run, so the sweep's note on machine load (variable note) is not printed.

if (!exists("dir")) dir = "build/plots"
if (!exists("outfile")) outfile = "docs/plots/memory_per_rank.png"
f = dir . "/memory.dat"

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1800,1400 font "Sans,11" noenhanced
} else {
    set terminal png size 1800,1400 font "Sans,11" noenhanced
}
set output outfile

t = "Peak memory per rank, by what it holds (stacked), for every run of the sweep: lower is better"
t = t . "\nData parallel (ch2) copies everything on every rank; ZeRO (ch3) shards optimizer state, then gradients, then parameters over dp"
t = t . "\nExact counts of the tracking allocator (MiB = 2^20 bytes): the same on every run of the same command"
set multiplot title t font ",13"

stats f using 1 nooutput
set xrange [STATS_min - 0.7 : STATS_max + 0.7]
set xtics nomirror font ",9" scale 0
set grid ytics lc rgb "#dddddd"
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.8
# the same left and right edges in both panels, so the bars line up; one
# legend at the bottom of the picture, clear of the bars
set lmargin at screen 0.05
set rmargin at screen 0.985

# columns 3..8 are params grads optimizer activations comm other: band k
# runs from the sum of columns 3..k-1 to the sum of columns 3..k
upto(k) = (k < 3) ? 0 : sum [c = 3:k] column(c)
names = "params grads optimizer activations comm other"
colors = "#0072B2 #56B4E9 #009E73 #E69F00 #D55E00 #999999"

# ---------------------------------------------------------------- top: everything
set tmargin at screen 0.905
set bmargin at screen 0.555
set format x ""
set title "everything the rank holds: the model state plus activations and communication buffers" font ",11"
stats f using ($3 + $4 + $5 + $6 + $7 + $8) nooutput
set yrange [0 : 1.15 * STATS_max]
set ylabel "peak MiB per rank"
set key at screen 0.5, screen 0.012 center bottom horizontal maxrows 1 box opaque samplen 2 width 1 \
    title "what the memory holds (bottom to top; the lower panel uses the same colours); black line: peak of the sum, below the bar top when categories peak at different times"
plot for [k = 3:8] f using 1:((upto(k - 1) + upto(k)) / 2):(0.4):((upto(k) - upto(k - 1)) / 2) \
         with boxxyerror fs solid 0.9 border rgb "#333333" lc rgb word(colors, k - 2) \
         title (k == 7 ? "comm buffers" : word(names, k - 2)), \
     f using ($1 - 0.4):9:(0.8):(0) with vectors nohead lw 3 lc rgb "black" \
         title "peak of the sum", \
     f using 1:(upto(8)):(sprintf("%.0f", upto(8))) with labels offset 0,0.8 font ",9" notitle

# ---------------------------------------------------------------- bottom: model state
set tmargin at screen 0.505
set bmargin at screen 0.16
set format x "% h"
set title "the model state alone: params + grads + optimizer (AdamW's two moments), without activations" font ",11"
stats f using ($3 + $4 + $5) nooutput
set yrange [0 : 1.15 * STATS_max]
set ylabel "peak MiB per rank"
set xlabel "run (chapter, strategy, mesh, global batch in sequences)" offset 0,-3.2
unset key
plot f using 1:(0):xtic(10) with points ps 0 notitle, \
     for [k = 3:5] f using 1:((upto(k - 1) + upto(k)) / 2):(0.4):((upto(k) - upto(k - 1)) / 2) \
         with boxxyerror fs solid 0.9 border rgb "#333333" lc rgb word(colors, k - 2) notitle, \
     f using 1:(upto(5)):(sprintf("%.1f", upto(5))) with labels offset 0,0.8 font ",9" notitle
unset multiplot
set output
