# file: 06_sequence_context/ring.c
# Every pair writes the partials instead of merging into them: a query part
# keeps only the last block it met.
s|if (!f->started\[qp\]) {|if (1) {|
