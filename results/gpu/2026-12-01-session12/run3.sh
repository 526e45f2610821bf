#!/bin/bash
# Session 12 call 3 (one H200): the copier's fences polled through events. The final code's
# GPU suite across 2 simulated nodes sharing the GPU; then old (HEAD) against new, both with
# the temporary staging trace, alternating.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_capture,gpu_training,latency_probe,gpu_multinode > $OUT/dc.out 2>&1
cat $OUT/dc.out
SMDDP_HAVE_FABRIC=ON SMDDP_BUILD_DIR=$b SMDDP_TEST_PYTHON=$py PYTHONPATH=$b/python timeout 240 $py -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_gpu_multinode.py > $OUT/gpu_multinode.log 2>&1
echo "gpu_multinode rc=$?"; tail -3 $OUT/gpu_multinode.log
for v in old new; do
  (cmake -S devtmp/$v -B build-$v -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/cfg_$v.log 2>&1 && \
   cmake --build build-$v -j16 --target smddp-daemon smddp_torch_plugin smddprun > $OUT/build_$v.log 2>&1) || { echo "$v build failed"; tail -20 $OUT/build_$v.log; }
done
for round in 1 2; do
  for v in old new; do
    bb=$PWD/build-$v
    d=$OUT/trace_${v}_$round; mkdir -p $d
    SMDDP_DIAG_TRACE_DIR=$d OPS=allreduce,allgather ITERS=300 PYTHONPATH=$bb/python timeout 100 \
      $bb/bin/smddprun --daemon $bb/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 -- $py -u devtmp/staged_lat.py > $d/run.log 2>&1
    echo "== $v round $round rc=$?"; grep -E '^all' $d/run.log
    $py devtmp/trace_report.py $d > $d/report.txt 2>&1
    rm -f $d/trace.*.txt
  done
done
for v in old new; do echo "== report $v round 2"; cat $OUT/trace_${v}_2/report.txt | grep -A1 -E '^(allreduce|allgather) (8|32768|131072):' | head -40; done
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json
