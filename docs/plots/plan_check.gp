# plan_check.gp: the planner against the runs of make plan-check, two panels:
# predicted against measured ms per step (the time model), and predicted
# against measured peak bytes per rank (exact counts), one point per run,
# coloured by chapter, with the line predicted = measured; the runs more
# than 10% off are named.
#
#   gnuplot -e "datafile='docs/plots/data/plan_check.tsv'; outfile='build/plots/plan_check.png'" docs/plots/plan_check.gp
#
# Reads the table common/tools/plan_check.sh writes: name chapter ranks
# predicted_ms measured_ms error predicted_peak_bytes measured_peak_bytes;
# its first line (a comment) names the profile and the load, shown as a subtitle.

if (!exists("datafile")) datafile = "docs/plots/data/plan_check.tsv"
if (!exists("outfile")) outfile = "build/plots/plan_check.png"
header = system("head -1 '" . datafile . "' | sed 's/^# //'")
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1600,760 font "Sans,11" noenhanced
} else {
    set terminal png size 1600,760 noenhanced
}
set output outfile
set datafile separator "\t"
set datafile commentschars "#"
set multiplot layout 1,2 title "build/plan against the runs of the committed sweep's configurations (make plan-check)\n" . header font ",12"
set key top left
set grid
# one colour per chapter (0, 2 to 7)
color(c) = c == 0 ? 0x000000 : c == 2 ? 0x1f77b4 : c == 3 ? 0xd62728 : c == 4 ? 0x2ca02c : \
           c == 5 ? 0xff7f0e : c == 6 ? 0x9467bd : 0x8c564b

stats datafile using 4:5 nooutput
tmax = (STATS_max_x > STATS_max_y ? STATS_max_x : STATS_max_y) * 1.1
set title "ms per step: the time model (points off the line are its error)"
set xlabel "measured ms per step"
set ylabel "predicted ms per step"
set xrange [0:tmax]
set yrange [0:tmax]
plot x title "predicted = measured" lc rgb "#888888" dt 2, \
     x * 1.2 title "+-20%" lc rgb "#bbbbbb" dt 3, x / 1.2 notitle lc rgb "#bbbbbb" dt 3, \
     for [c in "0 2 3 4 5 6 7"] datafile using ($2 == c ? $5 : 1/0):4 title "chapter " . c with points pt 7 ps 1.3 lc rgb color(c + 0), \
     datafile using 5:4:(abs($6) > 0.1 ? stringcolumn(1) : "") notitle with labels offset 0.8,0.6 left font ",8" tc rgb "#555555"

stats datafile using ($7 / 1048576):($8 / 1048576) nooutput
bmax = (STATS_max_x > STATS_max_y ? STATS_max_x : STATS_max_y) * 1.1
set title "peak MiB per rank (the fullest rank): exact counts, on the line"
set xlabel "measured peak MiB (the run's summary)"
set ylabel "predicted peak MiB (build/plan)"
set xrange [0:bmax]
set yrange [0:bmax]
plot x title "predicted = measured" lc rgb "#888888" dt 2, \
     for [c in "0 2 3 4 5 6 7"] datafile using ($2 == c ? $8 / 1048576 : 1/0):($7 / 1048576) title "chapter " . c with points pt 7 ps 1.3 lc rgb color(c + 0)
unset multiplot
