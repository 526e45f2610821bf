#!/bin/bash
# Session 12 call 9 (2 H200, lent at the end): this session's code on two GPUs. The capture
# test with 2 ranks (barrier refused), across 2 simulated nodes, then small allreduces across 2
# simulated nodes (each rank its own GPU) old (818d429) against new, two rounds, then training.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_training,latency_probe > $OUT/dc.out 2>&1
head -9 $OUT/dc.out; nvidia-smi -L
(cmake -S devtmp/old -B build-old -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_old.log 2>&1 && \
 cmake --build build-old -j32 --target smddp-daemon smddp_torch_plugin smddprun > /tmp/build_old.log 2>&1) || { echo "old build failed"; tail -5 /tmp/build_old.log; }
for round in 1 2; do
  for v in old new; do
    bb=$PWD/build-$v; [ $v = new ] && bb=$b
    SIZES=8,32768,131072,1048576 SMDDP_DIAG_TRACE_DIR=/tmp OPS=allreduce ITERS=500 PYTHONPATH=$bb/python timeout 60 \
      $bb/bin/smddprun --daemon $bb/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 -- $py -u results/gpu/2026-12-01-session12/staged_lat.py > /tmp/lat.log 2>&1
    echo "== $v round $round rc=$?"; grep -E '^all' /tmp/lat.log | paste - -
  done
done > $OUT/lat.log
cat $OUT/lat.log
SMDDP_BUILD_DIR=$b SMDDP_TEST_PYTHON=$py PYTHONPATH=$b/python timeout 150 $py -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_gpu_training.py -k smddprun > $OUT/gpu_training.log 2>&1
echo "training rc=$?"; tail -2 $OUT/gpu_training.log
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json $OUT/build.log
