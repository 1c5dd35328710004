# expert_load.gp: chapter 7, the load of each expert of the first MoE layer
# through training, as a share of the fair load (1 = k N / E slots), one
# panel per --aux-coef (docs/plots/expert_load.sh writes the tables).
set terminal pngcairo size 1100,460 font "sans,10"
set output outfile
n = words(coefs)
set multiplot layout 1, n title "Chapter 7: token-slots per expert of the first MoE layer / fair share (1 = k N / E)"
set xlabel "step"
set ylabel "load / fair load"
# one y scale for every panel (the highest load of any), so the panels
# compare at a glance: with the auxiliary loss the lines stay near 1
ymax = 0
do for [i = 1:n] {
    f = sprintf("%s/ch7_load_aux%s.dat", dir, word(coefs, i))
    stats f nooutput
    do for [e = 2:STATS_columns] {
        stats f using e nooutput
        if (STATS_max > ymax) { ymax = STATS_max }
    }
}
set yrange [0:ymax * 1.05]
set grid ytics
do for [i = 1:n] {
    c = word(coefs, i)
    set title sprintf("--aux-coef %s", c)
    f = sprintf("%s/ch7_load_aux%s.dat", dir, c)
    stats f nooutput
    ncols = STATS_columns
    # the legend (one colour per expert) on the first panel only
    if (i == 1) { set key top right maxrows 3 font ",8" samplen 2 } else { set key off }
    plot for [e = 2:ncols] f using 1:e with lines lw 1 title sprintf("expert %d", e - 2), \
         1 with lines dt 2 lc "black" title "fair share"
}
unset multiplot
