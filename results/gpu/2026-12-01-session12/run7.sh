#!/bin/bash
# Session 12 call 7 (one H200): the final code (94b1021). The GPU tests one GPU can run (the
# capture worker in a world of one rank, across 2 simulated nodes sharing the GPU), then small
# allreduces across 2 simulated nodes with rank 0 on CUDA tensors (no trace), two runs.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_training,latency_probe > $OUT/dc.out 2>&1
cat $OUT/dc.out | head -9
for i in 1 2; do
  MIXED=1 SIZES=8,32768,131072,1048576 SMDDP_DIAG_TRACE_DIR=/tmp OPS=allreduce ITERS=500 PYTHONPATH=$b/python timeout 100 \
    $b/bin/smddprun --daemon $b/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 -- $py -u devtmp/staged_lat.py > /tmp/lat_$i.log 2>&1
  echo "== run $i rc=$?"; grep -E '^all' /tmp/lat_$i.log | paste - -
done > $OUT/lat.log
cat $OUT/lat.log
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json $OUT/build.log
