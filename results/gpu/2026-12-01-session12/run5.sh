#!/bin/bash
# Session 12 call 5 (one H200): old (HEAD) against new (fences polled through events) with only
# rank 0 on CUDA tensors (rank 1 on host tensors: one context on the GPU, no time-slicing);
# four rounds alternating, allreduce 8 B to 4 MiB across 2 simulated nodes.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
for v in old new; do
  (cmake -S devtmp/$v -B build-$v -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_$v.log 2>&1 && \
   cmake --build build-$v -j16 --target smddp-daemon smddp_torch_plugin smddprun > $OUT/build_$v.log 2>&1) || { echo "$v build failed"; tail -20 $OUT/build_$v.log; }
done
for round in 1 2 3 4; do
  for v in old new; do
    bb=$PWD/build-$v
    d=/tmp/trace_${v}_$round; rm -rf $d; mkdir -p $d
    MIXED=1 SIZES=8,32768,131072,1048576,4194304 SMDDP_DIAG_TRACE_DIR=$d OPS=allreduce ITERS=500 PYTHONPATH=$bb/python timeout 100 \
      $bb/bin/smddprun --daemon $bb/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 -- $py -u devtmp/staged_lat.py > $d/run.log 2>&1
    echo "== $v round $round rc=$?"; grep -E '^all' $d/run.log | paste - - 
    $py devtmp/trace_report.py $d > $d/report.txt 2>&1
    { echo "=== $v round $round"; grep -E '^all' $d/run.log; cat $d/report.txt; } >> $OUT/rounds.log
  done
done
