#!/bin/bash
# Session 13 call 4 (one H200): fence_probe with its new pipeline section (a fence's host
# function on the copies' stream against one on a signal stream), twice.
set -u
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
$nvcc -O2 -arch=sm_90 -std=c++17 -o /tmp/fence_probe scripts/diag/fence_probe.cu -lcuda -lpthread > $OUT/fence_build.log 2>&1 || tail -5 $OUT/fence_build.log
nvidia-smi -L
for i in 1 2; do timeout 100 /tmp/fence_probe 1000 > $OUT/fence_probe_$i.log 2>&1; echo "fence_probe $i rc=$?"; done
cat $OUT/fence_probe_1.log; sed -n '/pipeline/,$p' $OUT/fence_probe_2.log
