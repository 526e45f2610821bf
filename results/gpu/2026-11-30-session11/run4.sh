#!/bin/bash
# Session 11 call 4: the whole capture worker in each execution mode, with stacks after 45 s.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_capture,gpu_training,latency_probe,gpu_multinode > $OUT/dc.out 2>&1
cat $OUT/dc.out | head -3
which gdb py-spy 2>&1 | head -2
for mode in daemon rank; do
  echo "=== $mode"
  SMDDP_GPU_EXEC=$mode SMDDP_TEST_STACKS_AFTER=45 PYTHONPATH=$b/python PYTHONUNBUFFERED=1 timeout 80 \
    $b/bin/smddprun --daemon $b/bin/smddp-daemon --nproc-per-node 2 -- $py -u tests/python/workers/gpu_capture_worker.py 2>&1 | cut -c1-300 > $OUT/w_$mode.log
  echo "rc=${PIPESTATUS[0]}"
  pkill -x smddp-daemon; pkill -f gpu_capture_worker; sleep 1
  grep -c "OK" $OUT/w_$mode.log
  grep -v "^ *$" $OUT/w_$mode.log | grep -v " OK *$" | tail -60
done
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json $OUT/build.log
