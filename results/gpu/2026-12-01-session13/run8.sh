#!/bin/bash
# Session 13 call 8 (one H200): the final code: the copier test and the suite across 2
# simulated nodes sharing the GPU, with the chained checks (ops on one tensor, list forms).
set -u
export PATH=/opt/torch/.venv/bin:$PATH
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_capture,gpu_training,latency_probe > $OUT/dc.out 2>&1
echo "device-check rc=$?"; head -9 $OUT/dc.out; nvidia-smi -L; tail -2 $OUT/gpu_multinode.log
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/build.log
