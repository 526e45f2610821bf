#!/bin/bash
# Session 12 call 4 (one H200): old (HEAD) against new (fences polled through events), three
# rounds alternating, allreduce 8 B to 4 MiB across 2 simulated nodes sharing the GPU.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
for v in old new; do
  (cmake -S devtmp/$v -B build-$v -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/cfg_$v.log 2>&1 && \
   cmake --build build-$v -j16 --target smddp-daemon smddp_torch_plugin smddprun > $OUT/build_$v.log 2>&1) || { echo "$v build failed"; tail -20 $OUT/build_$v.log; }
done
rm -f $OUT/cfg_*.log
for round in 1 2 3; do
  for v in old new; do
    bb=$PWD/build-$v
    d=/tmp/trace_${v}_$round; rm -rf $d; mkdir -p $d
    SIZES=8,32768,131072,1048576,4194304 SMDDP_DIAG_TRACE_DIR=$d OPS=allreduce ITERS=300 PYTHONPATH=$bb/python timeout 100 \
      $bb/bin/smddprun --daemon $bb/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 -- $py -u devtmp/staged_lat.py > $d/run.log 2>&1
    echo "== $v round $round rc=$?"; grep -E '^all' $d/run.log
    $py devtmp/trace_report.py $d > $d/report.txt 2>&1
    { echo "=== $v round $round"; cat $d/run.log | grep -E '^all'; cat $d/report.txt; } >> $OUT/rounds.log
  done
done
grep -E '^(===|allreduce [0-9]+:)' $OUT/rounds.log
