# throughput.gp: training throughput (tokens/s) of every run, and chapter 2's
# strong- and weak-scaling series against ideal scaling.
#
#   gnuplot -e "dir='build/plots'; outfile='docs/plots/tokens_per_s.png'" docs/plots/throughput.gp
#
# Reads dir/runs.dat (x chapter ranks batch steps ms_per_step tokens_per_s mfu
# mode label) and dir/scaling.dat (ranks batch batch_per_rank tokens_per_s).
# Variables: strong_batch (the strong series' global batch, 8), weak_per_rank
# (the weak series' sequences per rank, 4), note (a line under the title).

if (!exists("dir")) dir = "build/plots"
if (!exists("outfile")) outfile = "docs/plots/tokens_per_s.png"
if (!exists("note")) note = ""
if (!exists("strong_batch")) strong_batch = 8
if (!exists("weak_per_rank")) weak_per_rank = 4
f = dir . "/runs.dat"
g = dir . "/scaling.dat"

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 2300,1000 font "Sans,11" noenhanced
} else {
    set terminal png size 2300,1000 font "Sans,11" noenhanced
}
set output outfile

t = "Training throughput: tokens per second of the whole job (global batch x 256 tokens / time per step, steps 2..N), higher is better"
if (strlen(note) > 0) t = t . "\n" . note
set multiplot title t font ",13"

# ---------------------------------------------------------------- left: every run
# wide enough that the two-line run labels ("overlapped") do not touch
set origin 0, 0
set size 0.70, 0.93
set title "every run (colour = chapter), tokens/s over the bar"
stats f using 1 nooutput
set xrange [STATS_min - 0.7 : STATS_max + 0.7]
stats f using 7 nooutput
set yrange [0 : 1.2 * STATS_max]
set ylabel "tokens/s (whole job)"
set xlabel "run (chapter, strategy, mesh, global batch in sequences)" offset 0,-3.2
set bmargin 11
set xtics nomirror font ",9" scale 0
set grid ytics lc rgb "#dddddd"
set style fill solid 0.85 border rgb "#333333"
set boxwidth 0.75
set key below box opaque samplen 2

chapters = system("awk '!/^#/ && NF { print $2 }' '" . f . "' | sort -un | tr '\\n' ' '")
chname(c) = c == 0 ? "chapter 0: the single-rank reference" : \
            c == 2 ? "chapter 2: data parallel (full replicas)" : \
            c == 3 ? "chapter 3: ZeRO / FSDP (sharded state)" : \
            c == 4 ? "chapter 4: tensor parallel + FSDP" : \
            c == 5 ? "chapter 5: pipeline" : \
            c == 6 ? "chapter 6: context / sequence parallel" : \
            c == 7 ? "chapter 7: mixture of experts" : sprintf("chapter %d", c)
# one colour a chapter (Okabe-Ito, colour-blind safe)
chcolor(c) = c == 0 ? 0x555555 : c == 2 ? 0x0072B2 : c == 3 ? 0x009E73 : c == 4 ? 0xE69F00 : \
             c == 5 ? 0xCC79A7 : c == 6 ? 0x56B4E9 : c == 7 ? 0xD55E00 : 0x999999
plot f using 1:(0):xtic(10) with points ps 0 notitle, \
     for [c in chapters] f using 1:(column(2) == int(c) ? column(7) : NaN) with boxes lc rgb chcolor(int(c)) title chname(int(c)), \
     f using 1:7:(sprintf("%.0f", column(7))) with labels offset 0,0.7 font ",9" notitle

# ---------------------------------------------------------------- right: scaling
unset title
reset
set origin 0.70, 0
set size 0.30, 0.93
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
