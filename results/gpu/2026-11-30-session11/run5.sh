#!/bin/bash
# Session 11 call 5: the capture worker 4 times in each execution mode (call 2's pytest step
# hung once, calls 3-4 did not), stacks after 35 s; then the pytest step as device-check runs it.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_capture,gpu_training,latency_probe,gpu_multinode > $OUT/dc.out 2>&1
head -2 $OUT/dc.out
for i in 1 2 3 4; do
  for mode in rank daemon; do
    t0=$(date +%s.%N)
    SMDDP_GPU_EXEC=$mode SMDDP_TEST_STACKS_AFTER=35 PYTHONPATH=$b/python PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 timeout 60 \
      $b/bin/smddprun --daemon $b/bin/smddp-daemon --nproc-per-node 2 -- $py -u tests/python/workers/gpu_capture_worker.py > $OUT/w_${mode}_$i.log 2>&1
    rc=$?
    echo "$mode run $i: rc=$rc $(grep -c ' OK' $OUT/w_${mode}_$i.log) OK, $(grep -c ' FAIL' $OUT/w_${mode}_$i.log) FAIL, $(echo "$(date +%s.%N) - $t0" | bc) s"
    pkill -x smddp-daemon; pkill -f gpu_capture_worker; sleep 0.5
    if [ $rc -eq 0 ]; then rm -f $OUT/w_${mode}_$i.log; fi
  done
done
SMDDP_TEST_STACKS_AFTER=60 SMDDP_BUILD_DIR=$b SMDDP_TEST_PYTHON=$py PYTHONPATH=$b/python timeout 200 $py -m pytest -x -q -rs \
  -p no:cacheprovider tests/gpu/test_gpu_capture.py > $OUT/gpu_capture.log 2>&1
echo "pytest rc=$?"; tail -2 $OUT/gpu_capture.log
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json $OUT/build.log
