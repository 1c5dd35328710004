# gantt.gp: chapter 5's per-rank timeline of one training step (the last one
# logged): one bar per action, F blue, B red, W green, from the
# {"type":"timeline"} records of a run (plots.sh writes the table:
# rank, start ms, end ms, type 0/1/2, microbatch, chunk).
#   gnuplot -e "dir='build/plots'; datafile='...'; title='...'; outfile='x.png'" gantt.gp
if (!exists("note")) note = ''
set terminal pngcairo size 1000,360 font ',10'
set output outfile
set title title . (note eq '' ? '' : "\n" . note) noenhanced
set xlabel 'ms from the first action of the step (host clock; 2 cores: ranks share them)'
set ylabel 'rank'
# ranks from the top, half a bar of room around them
stats datafile using 1 nooutput
stats datafile using 6 nooutput name 'CH'
set yrange [STATS_max + 0.6:STATS_min - 0.6]
set ytics 1
set key outside right top
set style fill solid 0.8 border lc rgb 'black'
colour(t) = t == 0 ? 0x3366cc : (t == 1 ? 0xcc3333 : 0x33aa55)
# each bar says its action as --show-schedule does: F3, B3, W3 (F3.1 for chunk 1)
name(t, mb, c, chunks) = (t == 0 ? 'F' : (t == 1 ? 'B' : 'W')) . sprintf('%d', mb) . (chunks > 0 ? sprintf('.%d', c) : '')
plot datafile using (($2 + $3) / 2):1:(($3 - $2) / 2):(0.35):(colour($4)) with boxxyerror lc rgb variable notitle, \
     datafile using (($2 + $3) / 2):1:(name($4, $5, $6, CH_max)) with labels font ',8' tc rgb 'white' notitle, \
     NaN with boxes lc rgb '#3366cc' title 'F forward', \
     NaN with boxes lc rgb '#cc3333' title 'B backward (zb: input half)', \
     NaN with boxes lc rgb '#33aa55' title 'W weight half (zb)'
