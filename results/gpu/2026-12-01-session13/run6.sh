#!/bin/bash
# Session 13 call 6 (one H200): large CUDA ops across 2 simulated nodes over the shm provider,
# old (9ebc5fa) / new (HEAD) / onlane (HEAD with the fences' host functions back on the lanes),
# rank 0 on CUDA tensors, rank 1 on host tensors; 5 rounds, order rotating.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
for v in old new onlane; do
  (cmake -S devtmp/$v -B build-$v -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_$v.log 2>&1 && \
   cmake --build build-$v -j16 --target smddp-daemon smddp_torch_plugin smddprun > /tmp/build_$v.log 2>&1) || { echo "$v build failed"; tail -20 /tmp/build_$v.log; }
done
orders=("old new onlane" "new onlane old" "onlane old new" "old onlane new" "new old onlane")
for round in 1 2 3 4 5; do
  for v in ${orders[$((round-1))]}; do
    bb=$PWD/build-$v
    echo "round $round"
    MIXED=1 MODES=sync SKIP_CPU=1 SIZES=1048576,4194304,16777216 ITERS=400 CAP_BYTES=$((2<<30)) PYTHONPATH=$bb/python timeout 100 \
      $bb/bin/smddprun --daemon $bb/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 --set fabric.provider=shm \
      -- $py -u devtmp/staged_cpu.py > /tmp/lat.log 2>&1
    echo "== $v rc=$?"; grep -E '^(sync|async)' /tmp/lat.log
  done
done > $OUT/large_shm.log 2>&1
cat $OUT/large_shm.log | grep -v "^round"
