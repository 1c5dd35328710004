# file: 05_pipeline/pipeline.c
# Every stage takes L / S layers, the L mod S left over go to nobody (an
# uneven split drops layers: 6 over 4 stages runs 4 of them).
s/LayerRange r = {k \* base + (k < extra ? k : extra), base + (k < extra ? 1 : 0)};/LayerRange r = {k * base + (k < extra ? k : extra), base};/
