#!/bin/bash
# Session 11 call 6: closes of freed peers' mappings wait until this rank's GPU work is done
# (call 5: the capture worker hung in 2 of 4 rank-executed runs). The worker 4 times in each
# execution mode, then the pytest step, the collectives (freed memory returns) and training.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_capture,gpu_training,latency_probe,gpu_multinode > $OUT/dc.out 2>&1
head -2 $OUT/dc.out
hangs=0
for i in 1 2 3 4; do
  for mode in rank daemon; do
    s0=$SECONDS
    SMDDP_GPU_EXEC=$mode SMDDP_TEST_STACKS_AFTER=35 PYTHONPATH=$b/python PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 timeout 60 \
      $b/bin/smddprun --daemon $b/bin/smddp-daemon --nproc-per-node 2 -- $py -u tests/python/workers/gpu_capture_worker.py > $OUT/w_${mode}_$i.log 2>&1
    rc=$?
    echo "$mode run $i: rc=$rc $(grep -c ' OK' $OUT/w_${mode}_$i.log) OK, $(grep -c ' FAIL' $OUT/w_${mode}_$i.log) FAIL, $((SECONDS - s0)) s"
    pkill -x smddp-daemon; pkill -f gpu_capture_worker; sleep 0.5
    if [ $rc -eq 0 ]; then rm -f $OUT/w_${mode}_$i.log; else hangs=$((hangs + 1)); fi
  done
done
if [ $hangs -le 1 ]; then
  SMDDP_TEST_STACKS_AFTER=60 SMDDP_BUILD_DIR=$b SMDDP_TEST_PYTHON=$py PYTHONPATH=$b/python timeout 200 $py -m pytest -x -q -rs \
    -p no:cacheprovider tests/gpu/test_gpu_capture.py > $OUT/gpu_capture.log 2>&1
  echo "capture pytest rc=$?"; tail -1 $OUT/gpu_capture.log
  SMDDP_BUILD_DIR=$b SMDDP_TEST_PYTHON=$py PYTHONPATH=$b/python timeout 200 $py -m pytest -q -rs -p no:cacheprovider \
    tests/gpu/test_gpu_collectives.py -k "smddprun or daemon_exec" > $OUT/coll.log 2>&1
  echo "collectives rc=$?"; tail -1 $OUT/coll.log
  SMDDP_BUILD_DIR=$b SMDDP_TEST_PYTHON=$py PYTHONPATH=$b/python timeout 120 $py -m pytest -q -rs -p no:cacheprovider \
    tests/gpu/test_gpu_training.py -k "smddprun" > $OUT/gpu_training.log 2>&1
  echo "training rc=$?"; tail -1 $OUT/gpu_training.log
fi
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json $OUT/build.log
