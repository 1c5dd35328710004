# ckpt_levels.gp: what a checkpoint costs per level and mode (chapter 3,
# small model, dp 4 ZeRO-3, 4 simulated nodes; docs/plots/ckpt_levels.sh
# writes the tables from common/tools/ckpt_levels_bench.sh's runs).
# Left: ms the training loop was held per save, two rounds; right: MiB
# rank 0 wrote per save, the state serialised and the rest.
set terminal pngcairo size 1100,520 font "sans,10" noenhanced
set output outfile
set multiplot layout 1,2 title "Checkpoint levels: chapter 3, small model (124 MiB of state), dp 4 ZeRO-3, 4 simulated nodes; rank 0, measured\n".load
set style data histogram
set style fill solid 0.8 border -1
set boxwidth 0.8
set grid ytics
set xtics rotate by -35 scale 0
set yrange [0:*]
set key top left
set title "stall per save (ms in the training loop)"
set style histogram clustered gap 1
plot sprintf("%s/ckpt_stall.dat", dir) using 2:xtic(1) title "round 1", '' using 3 title "round 2"
set title "bytes written per save (MiB, rank 0)"
set style histogram rowstacked
plot sprintf("%s/ckpt_bytes.dat", dir) using 2:xtic(1) title "the state, serialised", '' using 3 title "partner copy, parity, or drained copy"
unset multiplot
