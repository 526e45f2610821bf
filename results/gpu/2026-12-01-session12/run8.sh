#!/bin/bash
# Session 12 call 8 (one H200): passed() asks the event about a lane's latest fence only. The GPU
# tests one GPU can run (the capture worker in a world of one rank, across 2 simulated nodes
# sharing the GPU), then allreduces across 2 simulated nodes with rank 0 on CUDA tensors, two runs.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_training,latency_probe > $OUT/dc.out 2>&1
cat $OUT/dc.out | head -9
for i in 1 2; do
  MIXED=1 SIZES=8,32768,131072,1048576,4194304 SMDDP_DIAG_TRACE_DIR=/tmp OPS=allreduce ITERS=500 PYTHONPATH=$b/python timeout 100 \
    $b/bin/smddprun --daemon $b/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 -- $py -u results/gpu/2026-12-01-session12/staged_lat.py > /tmp/lat_$i.log 2>&1
  echo "== run $i rc=$?"; grep -E '^all' /tmp/lat_$i.log | paste - -
done > $OUT/lat.log
cat $OUT/lat.log
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json $OUT/build.log
