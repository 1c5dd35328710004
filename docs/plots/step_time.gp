# step_time.gp: where each run's step time goes, three ways: blocked waiting
# on communication, driving non-blocking communication (the host inside the
# starts and comm_test), and the rest (computing, with any communication that
# ran under it).
#
#   gnuplot -e "dir='build/plots'; outfile='docs/plots/step_time_split.png'" docs/plots/step_time.gp
#
# Reads dir/time.dat (docs/plots/extract.sh): x ms_per_step wait_rank0 rest
# wait_max_over_ranks wait_rank0_timed_steps progress_rank0 label, in ms per
# step. The wait is comm_wait_s / steps (the progress likewise
# comm_progress_s / steps): it averages ALL steps, the first included,
# while ms_per_step averages steps 2..N (see docs/plots.md, "Where the step time goes").
# note: one line under the title; mixed (plots.sh, from sweep.txt): which runs
# were made at other times, under other loads. One row per run (rows.gpi):
# the picture's height follows the number of runs; two panels side by side.

if (!exists("dir")) dir = "build/plots"
if (!exists("outfile")) outfile = "docs/plots/step_time_split.png"
if (!exists("note")) note = ""
if (!exists("mixed")) mixed = ""
f = dir . "/time.dat"
load system("dirname '" . ARG0 . "'") . "/rows.gpi"

# one row per run, a free row above each chapter for its name: the picture
# grows with the runs, row_px pixels a row
stats f using 1 nooutput
row_first = STATS_min - 1
row_last = STATS_max
nrows = row_last - row_first + 1
# the panels' widths (before any range is set: stats honours them)
stats f using ($2 > $5 ? $2 : $5) nooutput
ms_max = STATS_max
stats f using ($2 > 0 ? 100 * ($5 > $3 + $7 ? $5 : $3 + $7) / $2 : 0) nooutput
share_top = (STATS_max > 0 ? 1.2 * STATS_max : 1)
top_px = 125 + (strlen(note) > 0 ? 20 : 0) + (strlen(mixed) > 0 ? 40 : 0)
bottom_px = 190
height = top_px + nrows * row_px + bottom_px
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1900,height font "Sans,11" noenhanced
} else {
    set terminal png size 1900,height font "Sans,11" noenhanced
}
set output outfile

t = "Time per training step, rank 0: computing vs communicating (inside non-blocking starts and tests) vs blocked waiting on communication; lower is better"
t = t . "\nwait = seconds inside blocking collectives and waits (comm_wait_s) / steps; communicating = seconds inside non-blocking starts and comm_test (comm_progress_s) / steps; bar = ms per step of steps 2..N"
if (strlen(note) > 0) t = t . "\n" . note
if (strlen(mixed) > 0) t = t . "\n" . wrap_mixed(mixed)
set multiplot title t font ",12"

set yrange [row_last + 0.7 : row_first - 0.7]
set ytics nomirror font ",9" scale 0
set xtics nomirror
set grid xtics lc rgb "#dddddd"
set style fill solid 0.9 border rgb "#333333"
# the same top and bottom edges in both panels, so the rows line up; each
# panel's legend below it
set tmargin at screen 1.0 - (top_px - 10.0) / height
set bmargin at screen 1.0 * bottom_px / height

# ---------------------------------------------------------------- left: ms per step
set lmargin at screen 0.17
set rmargin at screen 0.575
set title "ms per step, split three ways" font ",11"
set xrange [0 : 1.15 * ms_max]
set xlabel "ms per step"
set key at screen 0.3725, screen 0.008 center bottom vertical maxrows 5 box opaque samplen 2 spacing 1.05 width 1
plot f using (0):1:ytic(8) with points ps 0 notitle, \
     f using ($2 / 2):1:($2 / 2):(0.38) with boxxyerror lc rgb "#56B4E9" title "computing (and communication that ran under it)", \
     f using (($3 + $7) / 2):1:(($3 + $7) / 2):(0.38) with boxxyerror lc rgb "#009E73" title "communicating: inside non-blocking starts and tests, rank 0", \
     f using ($3 / 2):1:($3 / 2):(0.38) with boxxyerror lc rgb "#D55E00" title "blocked waiting on communication, rank 0 (all steps' wait / steps)", \
     f using 5:1 with points pt 9 ps 1.5 lc rgb "black" title "largest wait of any rank (same rule)", \
     f using 6:1 with points pt 6 ps 1.5 lw 2 lc rgb "#7F3C8D" title "rank 0's wait in steps 2..N only (comm_wait_ms_per_step, where logged)", \
     f using 2:1:(sprintf("%.0f ms", $2)) with labels left offset 0.6,0 font ",9" notitle, \
     headers(f) using (0):1:(chname($2)):(chcolor($2)) with labels left offset 0.3,0 \
         font "Sans Bold,10" tc rgb variable notitle

# ---------------------------------------------------------------- right: the share
set lmargin at screen 0.60
set rmargin at screen 0.985
set title "communicating + waiting, as a share of the step" font ",11"
set xrange [0 : share_top]
set xlabel "% of the step"
set ytics format ""
set key at screen 0.7925, screen 0.008 center bottom vertical maxrows 5 box opaque samplen 2 spacing 1.05 width 1
# the number after each bar is the bar's own length (green + orange); it goes
# after the triangle where the triangle would cover it
share(a, b, c) = 100 * (a + b) / c
label_x(bar, tri) = (tri > bar && tri - bar < 0.12 * share_top) ? tri : bar
plot f using (100 * ($3 + $7) / $2 / 2):1:(100 * ($3 + $7) / $2 / 2):(0.38) with boxxyerror lc rgb "#009E73" \
         title "communicating + waiting, rank 0, share of its step (the number after the bar)", \
     f using (100 * $3 / $2 / 2):1:(100 * $3 / $2 / 2):(0.38) with boxxyerror lc rgb "#D55E00" \
         title "of which blocked waiting (the orange part / the bar)", \
     f using (100 * $5 / $2):1 with points pt 9 ps 1.5 lc rgb "black" title "largest wait of any rank / the step", \
     f using (label_x(share($3, $7, $2), 100 * $5 / $2)):1:(sprintf("%.1f%%", share($3, $7, $2))) \
         with labels left offset 1.2,0 font ",9" notitle, \
     headers(f) using (0):1:(chname($2)):(chcolor($2)) with labels left offset 0.3,0 \
         font "Sans Bold,10" tc rgb variable notitle
unset multiplot
set output
