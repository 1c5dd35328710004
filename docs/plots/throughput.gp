# throughput.gp: training throughput (tokens/s) of every run, and chapter 2's
# strong- and weak-scaling series against ideal scaling.
#
#   gnuplot -e "dir='build/plots'; outfile='docs/plots/tokens_per_s.png'" docs/plots/throughput.gp
#
# Reads dir/runs.dat (x chapter ranks batch steps ms_per_step tokens_per_s mfu
# mode label) and dir/scaling.dat (ranks batch batch_per_rank tokens_per_s).
# Variables: strong_batch (the strong series' global batch, 8), weak_per_rank
# (the weak series' sequences per rank, 4), note (a line under the title),
# mixed (a line under it: the runs were measured at different times, plots.sh
# reads it from sweep.txt). One row per run: the picture's height follows the
# number of runs (rows.gpi).

if (!exists("dir")) dir = "build/plots"
if (!exists("outfile")) outfile = "docs/plots/tokens_per_s.png"
if (!exists("note")) note = ""
if (!exists("mixed")) mixed = ""
if (!exists("strong_batch")) strong_batch = 8
if (!exists("weak_per_rank")) weak_per_rank = 4
f = dir . "/runs.dat"
g = dir . "/scaling.dat"
load system("dirname '" . ARG0 . "'") . "/rows.gpi"

# one row per run, a free row above each chapter for its name: the picture
# grows with the runs, row_px pixels a row
stats f using 1 nooutput
row_first = STATS_min - 1
row_last = STATS_max
nrows = row_last - row_first + 1
top_px = 110 + (strlen(note) > 0 ? 20 : 0) + (strlen(mixed) > 0 ? 48 : 0)
bottom_px = 150
height = top_px + nrows * row_px + bottom_px
height = height < 760 + top_px ? 760 + top_px : height
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1900,height font "Sans,11" noenhanced
} else {
    set terminal png size 1900,height font "Sans,11" noenhanced
}
set output outfile

t = "Training throughput: tokens per second of the whole job (global batch x 256 tokens / time per step, steps 2..N), higher is better"
if (strlen(note) > 0) t = t . "\n" . note
if (strlen(mixed) > 0) t = t . "\n" . wrap_mixed(mixed)
set multiplot title t font ",13"

# ---------------------------------------------------------------- left: every run
set lmargin at screen 0.17
set rmargin at screen 0.62
set tmargin at screen 1.0 - (top_px - 10.0) / height
set bmargin at screen 1.0 * bottom_px / height
set title "every run, one row each (colour = chapter), tokens/s after the bar"
stats f using 7 nooutput
set xrange [0 : 1.15 * STATS_max]
set yrange [row_last + 0.7 : row_first - 0.7]
set xlabel "tokens/s (whole job)"
set ylabel ""
set ytics nomirror font ",9" scale 0
set xtics nomirror
set grid xtics lc rgb "#dddddd"
set style fill solid 0.85 border rgb "#333333"
set key at screen 0.395, screen 0.01 center bottom horizontal maxrows 3 box opaque samplen 2 width 1

chapters = system("awk '!/^#/ && NF { print $2 }' '" . f . "' | sort -un | tr '\\n' ' '")
# bars: boxxyerror from 0 to the value, 0.76 of a row high
plot f using (0):1:ytic(10) with points ps 0 notitle, \
     for [c in chapters] f using ($7 / 2):(column(2) == int(c) ? $1 : NaN):($7 / 2):(0.38) \
         with boxxyerror lc rgb chcolor(int(c)) title chname(int(c)), \
     f using 7:1:(sprintf("%.0f", $7)) with labels left offset 0.5,0 font ",9" notitle, \
     headers(f) using (0):1:(chname($2)):(chcolor($2)) with labels left offset 0.3,0 \
         font "Sans Bold,10" tc rgb variable notitle

# ---------------------------------------------------------------- right: scaling
unset title
reset
# the top of the picture's right side, 700 pixels high whatever the rows
set lmargin at screen 0.67
set rmargin at screen 0.985
set tmargin at screen 1.0 - (top_px - 10.0) / height
set bmargin at screen 1.0 - (top_px + 700.0) / height
set title sprintf("chapter 2 (overlapped) on 1, 2 and 4 ranks\nstrong scaling: global batch fixed at %d sequences\nweak scaling: %d sequences per rank", \
                  strong_batch, weak_per_rank)
rows = int(system("grep -vc '^#' '" . g . "' || true"))
ymax = 0
if (rows > 0) {
    stats g using 4 nooutput
    ymax = STATS_max
}
base_s = system(sprintf("awk '!/^#/ && $1 == 1 && $2 == %d { print $4; exit }' '%s'", strong_batch, g))
base_w = system(sprintf("awk '!/^#/ && $1 == 1 && $3 == %d { print $4; exit }' '%s'", weak_per_rank, g))
s1 = strlen(base_s) > 0 ? real(base_s) : NaN
w1 = strlen(base_w) > 0 ? real(base_w) : NaN
s1ok = s1 == s1 ? s1 : 0
w1ok = w1 == w1 ? w1 : 0
ideal_top = 4 * (s1ok > w1ok ? s1ok : w1ok)
ymax = ymax > ideal_top ? ymax : ideal_top
if (ymax <= 0) ymax = 1
set yrange [0 : 1.15 * ymax]
set xrange [0.5 : 4.5]
set xtics ("1" 1, "2" 2, "3" 3, "4" 4)
set xlabel "ranks (dp)"
set ylabel "tokens/s (whole job)"
set grid xtics ytics lc rgb "#dddddd"
set key top left box opaque samplen 3
set samples 400
set label 1 "Here every rank shares the same machine's cores, and one rank\nalready uses all of them (threads = cores / ranks): more ranks\ncannot add compute, so flat is the best case on one machine.\nThe N x lines are what N machines would give." \
    at graph 0.03, graph 0.84 left font ",9" textcolor rgb "#333333"
strong = sprintf("< awk '!/^#/ && $2 == %d' '%s'", strong_batch, g)
weak = sprintf("< awk '!/^#/ && $3 == %d' '%s'", weak_per_rank, g)
line(b, u) = (b == b && u >= 1 && u <= 4) ? b * u : NaN
plot line(s1, x) with lines lc rgb "#0072B2" dt 2 lw 1.5 title "strong, ideal: N x one rank", \
     strong using 1:4 with linespoints lc rgb "#0072B2" pt 7 ps 1.3 lw 2 title "strong scaling, measured", \
     line(w1, x) with lines lc rgb "#D55E00" dt 3 lw 1.5 title "weak, ideal: N x one rank", \
     weak using 1:4 with linespoints lc rgb "#D55E00" pt 5 ps 1.2 lw 2 title "weak scaling, measured"
unset multiplot
set output
