#!/bin/bash
# Session 12 call 2 (one H200): where a small CUDA op across 2 simulated nodes spends its time
# (temporary trace patch: client/diag_trace.hpp), and whether a second context on the GPU
# slows fences (two fence probes at once).
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_capture,gpu_training,latency_probe,gpu_multinode > $OUT/dc.out 2>&1
cat $OUT/dc.out
mkdir -p $OUT/trace
SMDDP_DIAG_TRACE_DIR=$OUT/trace OPS=allreduce,allgather ITERS=300 PYTHONPATH=$b/python timeout 200 \
  $b/bin/smddprun --daemon $b/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 -- $py -u devtmp/staged_lat.py > $OUT/staged_lat.log 2>&1
echo "staged_lat rc=$?"; grep -v 'smddp-daemon\[' $OUT/staged_lat.log | tail -30
$py devtmp/trace_report.py $OUT/trace > $OUT/trace_report.txt 2>&1; cat $OUT/trace_report.txt
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
$nvcc -O2 -arch=sm_90 -std=c++17 -o /tmp/fence_probe scripts/diag/fence_probe.cu -lcuda -lpthread > $OUT/fence_build.log 2>&1 || tail -5 $OUT/fence_build.log
(timeout 100 /tmp/fence_probe 1000 > $OUT/fence_pair_a.log 2>&1 &)
timeout 100 /tmp/fence_probe 1000 > $OUT/fence_pair_b.log 2>&1; sleep 2
echo "== two probes at once"; cat $OUT/fence_pair_a.log $OUT/fence_pair_b.log
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json
