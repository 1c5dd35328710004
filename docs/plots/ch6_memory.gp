# ch6_memory.gp: chapter 6, peak activation memory per rank against the
# sequence length, the ring at cp = 1, 2, 3 and Ulysses at cp = 2, 3 (small model, batch
# 1; docs/plots/ch6_memory.sh writes the tables, `names` lists them).
set terminal pngcairo size 900,520 font "sans,10" noenhanced
set output outfile
set title "Chapter 6: activations per rank (small model, batch 1), measured"
set xlabel "sequence length T"
set ylabel "peak activation bytes per rank (MiB)"
set key top left
set grid
set xrange [0:*]
set yrange [0:*]
n = words(names)
plot for [i = 1:n] sprintf("%s/ch6_mem_%s.dat", dir, word(names, i)) using 1:2 \
    with linespoints lw 2 pt (strstrt(word(names, i), "ulysses") ? 6 : 7) title word(names, i)
