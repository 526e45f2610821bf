#!/bin/bash
# Session 13 call 2 (one H200): old (HEAD 9ebc5fa) against new (the op's end on the copier's Out
# lane, no Out-lane wait for ops with inputs), synchronous allreduce across 2 simulated nodes,
# rank 0 on CUDA tensors, rank 1 on host tensors; 8 rounds alternating, 8 B-128 KiB.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
for v in old new; do
  (cmake -S devtmp/$v -B build-$v -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_$v.log 2>&1 && \
   cmake --build build-$v -j16 --target smddp-daemon smddp_torch_plugin smddprun > /tmp/build_$v.log 2>&1) || { echo "$v build failed"; tail -20 /tmp/build_$v.log; }
done
for round in 1 2 3 4 5 6 7 8; do
  order="old new"; [ $((round % 2)) = 0 ] && order="new old"
  for v in $order; do
    bb=$PWD/build-$v
    MIXED=1 MODES=sync SIZES=8,32768,131072 ITERS=1500 PYTHONPATH=$bb/python timeout 100 \
      $bb/bin/smddprun --daemon $bb/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 -- $py -u devtmp/staged_cpu.py > /tmp/lat.log 2>&1
    echo "== $v round $round rc=$?"; grep -E '^(sync|async)' /tmp/lat.log
  done
done > $OUT/rounds.log 2>&1
cat $OUT/rounds.log
