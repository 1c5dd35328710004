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
# note: one line under the title.

if (!exists("dir")) dir = "build/plots"
if (!exists("outfile")) outfile = "docs/plots/step_time_split.png"
if (!exists("note")) note = ""
f = dir . "/time.dat"

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1800,1050 font "Sans,11" noenhanced
} else {
    set terminal png size 1800,1050 font "Sans,11" noenhanced
}
set output outfile

t = "Time per training step, rank 0: computing vs communicating (inside non-blocking starts and tests) vs blocked waiting on communication; lower is better"
t = t . "\nwait = seconds inside blocking collectives and waits (comm_wait_s) / steps; communicating = seconds inside non-blocking starts and comm_test (comm_progress_s) / steps; bar = ms per step of steps 2..N"
if (strlen(note) > 0) t = t . "\n" . note
set multiplot title t font ",12"

stats f using 1 nooutput
set xrange [STATS_min - 0.7 : STATS_max + 0.7]
set xtics nomirror font ",9" scale 0
set grid ytics lc rgb "#dddddd"
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.8
set lmargin at screen 0.06
set rmargin at screen 0.985
# each panel's legend sits above the panel, outside it, so no bar (the
# batch-16 run's is twice as tall as the others) runs into it

# ---------------------------------------------------------------- top: ms per step
set tmargin at screen 0.825
set bmargin at screen 0.465
set format x ""
stats f using ($2 > $5 ? $2 : $5) nooutput
set yrange [0 : 1.12 * STATS_max]
set ylabel "ms per step"
set key at screen 0.5, screen 0.905 center top horizontal maxrows 3 box opaque samplen 2 spacing 1.1 width 1
plot f using 1:2 with boxes lc rgb "#56B4E9" title "computing (and communication that ran under it)", \
     f using 1:($3 + $7) with boxes lc rgb "#009E73" title "communicating: inside non-blocking starts and tests, rank 0", \
     f using 1:3 with boxes lc rgb "#D55E00" title "blocked waiting on communication, rank 0 (all steps' wait / steps)", \
     f using 1:5 with points pt 9 ps 1.8 lc rgb "black" title "largest wait of any rank (same rule)", \
     f using 1:6 with points pt 6 ps 1.8 lw 2 lc rgb "#7F3C8D" title "rank 0's wait in steps 2..N only (comm_wait_ms_per_step, where logged)", \
     f using 1:2:(sprintf("%.0f ms", $2)) with labels offset 0,0.7 font ",9" notitle

# ---------------------------------------------------------------- bottom: the share
set tmargin at screen 0.37
set bmargin at screen 0.14
set format x "% h"
stats f using ($2 > 0 ? 100 * ($5 > $3 + $7 ? $5 : $3 + $7) / $2 : 0) nooutput
share_top = (STATS_max > 0 ? 1.3 * STATS_max : 1)
set yrange [0 : share_top]
set ylabel "% of the step"
set xlabel "run (chapter, strategy, mesh, global batch in sequences)" offset 0,-3.2
set key at screen 0.5, screen 0.44 center top horizontal maxrows 2 box opaque samplen 2 spacing 1.1 width 1
# the number over each bar is the bar's own height (green + orange); it sits
# on the bar, or above the triangle where the triangle would cover it
bar(a, b, c) = 100 * (a + b) / c
label_y(bar, tri) = (tri > bar && tri - bar < 0.12 * share_top) ? tri : bar
plot f using 1:(0):xtic(8) with points ps 0 notitle, \
     f using 1:(100 * ($3 + $7) / $2) with boxes lc rgb "#009E73" title "communicating + waiting, rank 0, share of its step (the number over the bar)", \
     f using 1:(100 * $3 / $2) with boxes lc rgb "#D55E00" title "of which blocked waiting (the orange band above / the bar)", \
     f using 1:(100 * $5 / $2) with points pt 9 ps 1.8 lc rgb "black" title "largest wait of any rank / the step", \
     f using 1:(label_y(bar($3, $7, $2), 100 * $5 / $2)):(sprintf("%.1f%%", bar($3, $7, $2))) with labels offset 0,1.2 font ",9" notitle
unset multiplot
set output
