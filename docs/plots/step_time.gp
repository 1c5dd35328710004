# step_time.gp: where each run's step time goes: waiting on communication
# versus everything else (computing, and communication that overlapped it).
#
#   gnuplot -e "dir='build/plots'; outfile='docs/plots/step_time_split.png'" docs/plots/step_time.gp
#
# Reads dir/time.dat (docs/plots/extract.sh): x ms_per_step wait_rank0 rest
# wait_max_over_ranks wait_rank0_timed_steps label, in ms per step.
# The wait is comm_wait_s / steps: it averages ALL steps, the first included,
# while ms_per_step averages steps 2..N (see docs/README.md, "Plots").
# note: one line under the title.

if (!exists("dir")) dir = "build/plots"
if (!exists("outfile")) outfile = "docs/plots/step_time_split.png"
if (!exists("note")) note = ""
f = dir . "/time.dat"

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1800,950 font "Sans,11" noenhanced
} else {
    set terminal png size 1800,950 font "Sans,11" noenhanced
}
set output outfile

t = "Time per training step: blocked waiting on communication (bottom) vs the rest (computing, and communication hidden under it), rank 0; lower is better"
t = t . "\nwait = the seconds a rank spent inside blocking collectives and waits (comm_wait_s) / steps; bar height = ms per step of steps 2..N"
if (strlen(note) > 0) t = t . "\n" . note
set title t font ",12"

stats f using 1 nooutput
set xrange [STATS_min - 0.7 : STATS_max + 0.7]
stats f using ($2 > $5 ? $2 : $5) nooutput
set yrange [0 : 1.15 * STATS_max]
set ylabel "ms per step"
set xlabel "run (chapter, strategy, mesh, global batch in sequences)" offset 0,-1.2
set xtics nomirror font ",9" scale 0
set grid ytics lc rgb "#dddddd"
set key above box opaque samplen 2 spacing 1.1
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.8
set bmargin 6

plot f using 1:(0):xtic(7) with points ps 0 notitle, \
     f using 1:2 with boxes lc rgb "#56B4E9" title "the rest: computing (and communication that overlapped it)", \
     f using 1:3 with boxes lc rgb "#D55E00" title "waiting on communication, rank 0 (all steps' wait / steps)", \
     f using 1:5 with points pt 9 ps 2 lc rgb "black" title "largest wait of any rank (same rule)", \
     f using 1:6 with points pt 6 ps 2 lw 2 lc rgb "#7F3C8D" title "rank 0's wait in steps 2..N only (chapter 2 logs it)", \
     f using 1:2:(sprintf("%.0f ms\nwait %.0f", $2, $3)) with labels offset 0,1.2 font ",9" notitle
set output
