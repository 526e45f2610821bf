#!/bin/bash
# Session 13 call 3 (one H200): old (HEAD 9ebc5fa) against new (the op's end on the copier's Out
# lane; the fences' host functions on signal streams of their own, off the copy lanes), across
# 2 simulated nodes, rank 0 on CUDA tensors, rank 1 on host tensors. Synchronous allreduce
# 8 B-128 KiB over tcp, 8 rounds alternating; 1-16 MiB over the shm provider, 4 rounds; then
# test_gpu_multinode.py on new.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
for v in old new; do
  (cmake -S devtmp/$v -B build-$v -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_$v.log 2>&1 && \
   cmake --build build-$v -j16 --target smddp-daemon smddp_torch_plugin smddprun > /tmp/build_$v.log 2>&1) || { echo "$v build failed"; tail -20 /tmp/build_$v.log; }
done
run() {  # v label extra-env... -- smddprun args
  local v=$1; shift; local bb=$PWD/build-$v
  env MIXED=1 MODES=sync PYTHONPATH=$bb/python "$@" timeout 100 \
    $bb/bin/smddprun --daemon $bb/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 $SET -- $py -u devtmp/staged_cpu.py > /tmp/lat.log 2>&1
  echo "== $v rc=$?"; grep -E '^(sync|async)' /tmp/lat.log
}
SET=""
for round in 1 2 3 4 5 6 7 8; do
  order="old new"; [ $((round % 2)) = 0 ] && order="new old"
  for v in $order; do echo "round $round"; run $v SIZES=8,32768,131072 ITERS=1500; done
done > $OUT/small.log 2>&1
SET="--set fabric.provider=shm"
for round in 1 2 3 4; do
  order="old new"; [ $((round % 2)) = 0 ] && order="new old"
  for v in $order; do echo "round $round"; run $v SIZES=1048576,4194304,16777216 ITERS=200; done
done > $OUT/shm.log 2>&1
cat $OUT/small.log $OUT/shm.log | grep -v "^round"
b=$PWD/build-new
cmake --build $b -j16 > /tmp/build_all.log 2>&1 || tail -20 /tmp/build_all.log
SMDDP_BUILD_DIR=$b SMDDP_TEST_PYTHON=$py PYTHONPATH=$b/python SMDDP_HAVE_FABRIC=ON timeout 150 $py -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_gpu_multinode.py > $OUT/gpu_multinode.log 2>&1
echo "multinode rc=$?"; tail -3 $OUT/gpu_multinode.log
