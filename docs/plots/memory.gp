# memory.gp: peak memory per rank by category, one stacked bar per run.
#
#   gnuplot -e "dir='build/plots'; outfile='docs/plots/memory_per_rank.png'" docs/plots/memory.gp
#
# Reads dir/memory.dat (docs/plots/extract.sh): x rank params grads optimizer
# activations comm other total label, in MiB. The bar stacks each category's
# own peak; "total" (a black dash) is the peak of the sum, which is lower when
# categories peak at different moments. A run whose ranks hold different
# amounts has a second bar: the rank that differs most from rank 0.
# note: one line under the title (where and how the data was measured).

if (!exists("dir")) dir = "build/plots"
if (!exists("outfile")) outfile = "docs/plots/memory_per_rank.png"
if (!exists("note")) note = ""
f = dir . "/memory.dat"

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1800,950 font "Sans,11" noenhanced
} else {
    set terminal png size 1800,950 font "Sans,11" noenhanced
}
set output outfile

t = "Peak memory per rank, by what it holds (stacked), for every run of the sweep: lower is better"
t = t . "\nData parallel (ch2) copies everything on every rank; ZeRO (ch3) shards optimizer state, then gradients, then parameters over dp"
if (strlen(note) > 0) t = t . "\n" . note
set title t font ",13"

stats f using 1 nooutput
set xrange [STATS_min - 0.7 : STATS_max + 0.7]
stats f using ($3 + $4 + $5 + $6 + $7 + $8) nooutput
set yrange [0 : 1.15 * STATS_max]

set ylabel "peak MiB per rank (MiB = 2^20 bytes)"
set xlabel "run (chapter, strategy, mesh, global batch in sequences)" offset 0,-3.2
set bmargin 11
set xtics nomirror font ",9" scale 0
set grid ytics lc rgb "#dddddd"
set key below horizontal box opaque samplen 2 spacing 1.1 maxcols 7 title "what the memory holds (bottom to top); black line: peak of the sum, below the bar top when categories peak at different times"
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.8

# columns 3..8 are params grads optimizer activations comm other: band k
# runs from the sum of columns 3..k-1 to the sum of columns 3..k
upto(k) = (k < 3) ? 0 : sum [c = 3:k] column(c)
names = "params grads optimizer activations comm other"
colors = "#0072B2 #56B4E9 #009E73 #E69F00 #D55E00 #999999"
plot for [k = 3:8] f using 1:((upto(k - 1) + upto(k)) / 2):(0.4):((upto(k) - upto(k - 1)) / 2) \
         with boxxyerror fs solid 0.9 border rgb "#333333" lc rgb word(colors, k - 2) \
         title (k == 7 ? "comm buffers" : word(names, k - 2)), \
     f using ($1 - 0.4):9:(0.8):(0) with vectors nohead lw 3 lc rgb "black" \
         title "peak of the sum", \
     f using 1:(upto(8)):(sprintf("%.0f", upto(8))):xtic(10) with labels offset 0,0.8 font ",9" notitle
set output
