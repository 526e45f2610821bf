#!/bin/bash
# Session 14 call 8 (one H200 host, 16 cores): with the staging pool in both, the engine
# advancing its operations after each batch of transport completions (new) against draining
# them all first (old, 1ddf97a), across 2 simulated nodes, host tensors, shm and tcp.
set -u
bn=$PWD/build-new
(cmake -S . -B $bn -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_new.log 2>&1 && \
 cmake --build $bn -j16 --target smddp-daemon smddp-bench smddprun > /tmp/build_new.log 2>&1) || { echo "new build failed"; tail -20 /tmp/build_new.log; exit 1; }
(cmake -S devtmp/old -B build-old -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_old.log 2>&1 && \
 cmake --build build-old -j16 --target smddp-daemon > /tmp/build_old.log 2>&1) || { echo "old build failed"; tail -20 /tmp/build_old.log; exit 1; }
bench() {  # variant provider op
  local v=$1 p=$2 o=$3; echo "== $v $p $o"
  timeout 120 $bn/bin/smddprun --daemon $PWD/build-$v/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 --config configs/local.ini --set "fabric.provider=$p" -- $bn/bin/smddp-bench -o $o -b 1M -e 64M -f 4 -n 20 -w 3 -c 1 2>&1 | grep -E "^ +[0-9]+ |rror"
}
for r in 1 2 3; do for v in old new; do bench $v shm allreduce; done; done > $OUT/shm.log 2>&1
for r in 1 2; do for v in old new; do bench $v "tcp;ofi_rxm" allreduce; done; done > $OUT/tcp.log 2>&1
for r in 1 2; do for v in old new; do bench $v shm allgather; done; done > $OUT/shm_ag.log 2>&1
cat $OUT/shm.log $OUT/tcp.log $OUT/shm_ag.log
