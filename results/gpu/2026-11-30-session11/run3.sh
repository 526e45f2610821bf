#!/bin/bash
# Session 11 call 3: where the capture worker hangs (call 2: the gpu_capture step cut at 240 s).
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_capture,gpu_training,latency_probe,gpu_multinode > $OUT/dc.out 2>&1
cat $OUT/dc.out
for part in refusal beside; do
  echo "=== $part"
  SMDDP_TEST_CAPTURE_ONLY=$part SMDDP_TEST_STACKS_AFTER=35 PYTHONPATH=$b/python PYTHONUNBUFFERED=1 timeout 60 \
    $b/bin/smddprun --daemon $b/bin/smddp-daemon --nproc-per-node 2 -- $py -u tests/python/workers/gpu_capture_worker.py 4 2>&1 | cut -c1-400 > $OUT/w_$part.log
  echo "rc=${PIPESTATUS[0]}"
  pkill -x smddp-daemon; pkill -f gpu_capture_worker; sleep 1
  grep -v "^ *$" $OUT/w_$part.log | tail -45
done
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json $OUT/build.log
