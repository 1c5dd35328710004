# gantt.gp: chapter 5's per-rank timeline of one training step (the last one
# logged): one bar per action, F blue, B red, W green (named where the name
# fits in the bar), from the
# {"type":"timeline"} records of a run (plots.sh writes the table:
# rank, start ms, end ms, type 0/1/2, microbatch, chunk).
#   gnuplot -e "dir='build/plots'; datafile='...'; title='...'; outfile='x.png'" gantt.gp
if (!exists("note")) note = ''
set terminal pngcairo size 1000,380 font ',10'
set output outfile
# the note on its own lines: the machine, then its load
nl = strstrt(note, " (load")
note_lines = nl > 0 ? note[1:nl - 1] . "\n" . note[nl + 1:] : note
set title title . (note eq '' ? '' : "\n" . note_lines) noenhanced
# the plot's width in pixels is fixed (0.64 x 1000), for the bar names below
set lmargin at screen 0.06
set rmargin at screen 0.70
set xlabel 'ms from the first action of the step (host clock; 2 cores: ranks share them)'
set ylabel 'rank'
# ranks from the top, half a bar of room around them
stats datafile using 1 nooutput
stats datafile using 6 nooutput name 'CH'
stats datafile using 3 nooutput name 'END'
set yrange [STATS_max + 0.6:STATS_min - 0.6]
set xrange [0 : 1.03 * END_max]
set ytics 1
set key outside right top
set style fill solid 0.8 border lc rgb 'black'
colour(t) = t == 0 ? 0x3366cc : (t == 1 ? 0xcc3333 : 0x33aa55)
# each bar says its action as --show-schedule does: F3, B3, W3 (F3.1 for chunk 1)
name(t, mb, c, chunks) = (t == 0 ? 'F' : (t == 1 ? 'B' : 'W')) . sprintf('%d', mb) . (chunks > 0 ? sprintf('.%d', c) : '')
# only where the name fits in its bar: about 6 pixels a character at 8 pt,
# on a plot 640 pixels wide whose x axis ends 3% past the last action
fits(ms, s) = ms / (1.03 * END_max) * 640 >= 6 * strlen(s) + 3
label(t, mb, c, chunks, ms) = fits(ms, name(t, mb, c, chunks)) ? name(t, mb, c, chunks) : ''
plot datafile using (($2 + $3) / 2):1:(($3 - $2) / 2):(0.35):(colour($4)) with boxxyerror lc rgb variable notitle, \
     datafile using (($2 + $3) / 2):1:(label($4, $5, $6, CH_max, $3 - $2)) with labels font ',8' tc rgb 'white' notitle, \
     NaN with boxes lc rgb '#3366cc' title 'F forward', \
     NaN with boxes lc rgb '#cc3333' title 'B backward (zb: input half)', \
     NaN with boxes lc rgb '#33aa55' title 'W weight half (zb)'
