#!/bin/bash
# Session 13 call 1 (one H200): the across-nodes op's end on the copier's Out lane (new) against
# HEAD 9ebc5fa (old), and new without the progress thread's spin (nospin): us and rank 0's CPU per
# allreduce across 2 simulated nodes, rank 0 on CUDA tensors, rank 1 on host tensors; 3 rounds.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_capture,gpu_training,latency_probe > $OUT/dc.out 2>&1
echo "device-check rc=$?"; head -12 $OUT/dc.out; nvidia-smi -L
for v in old nospin; do
  (cmake -S devtmp/$v -B build-$v -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_$v.log 2>&1 && \
   cmake --build build-$v -j16 --target smddp-daemon smddp_torch_plugin smddprun > /tmp/build_$v.log 2>&1) || { echo "$v build failed"; tail -20 /tmp/build_$v.log; }
done
for round in 1 2 3; do
  for v in old new nospin; do
    bb=$PWD/build-$v; [ $v = new ] && bb=$b
    MIXED=1 PYTHONPATH=$bb/python timeout 120 \
      $bb/bin/smddprun --daemon $bb/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 -- $py -u devtmp/staged_cpu.py > /tmp/lat.log 2>&1
    echo "== $v round $round rc=$?"; grep -E '^(sync|async)' /tmp/lat.log
  done
done > $OUT/rounds.log 2>&1
cat $OUT/rounds.log
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/build.log
ls $OUT
