#!/bin/bash
# Session 16 call 2 (one H200 host, 16 cores): the session's daemon ("new": small Gather,
# Scatter and even AllToAll across nodes in one exchange, as every other collective since call 1)
# against the session start's (70350db, "old", from devtmp/old). The GPU suites one
# GPU can run on the new code first (the arena copier; every collective and dtype with CUDA
# tensors across 2 simulated nodes), then host-tensor latency across 2 simulated nodes (shm and
# tcp, 1 and 2 ranks a node), three rounds, alternating old and new.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
OUT=$OUT/check scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_training,latency_probe,gpu_capture \
  > $OUT/check.log 2>&1; echo "device-check rc=$?"
bn=$PWD/build-device
cmake --build $bn -j16 --target smddp-bench > /tmp/build_bench.log 2>&1 || { echo "bench build failed"; tail -20 /tmp/build_bench.log; exit 1; }
(cmake -S devtmp/old -B build-old -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_old.log 2>&1 && \
 cmake --build build-old -j16 --target smddp-daemon > /tmp/build_old.log 2>&1) || { echo "old build failed"; tail -20 /tmp/build_old.log; exit 1; }
daemon() { [ $1 = old ] && echo $PWD/build-old/bin/smddp-daemon || echo $bn/bin/smddp-daemon; }
order() { [ $1 = 2 ] && echo "new old" || echo "old new"; }
across() {  # variant provider ranks-per-node op
  echo "== $1 $2 x$3 $4"
  timeout 120 $bn/bin/smddprun --daemon $(daemon $1) --simulate-nodes 2 --nproc-per-node $3 --config configs/local.ini \
    --set "fabric.provider=$2" -- $bn/bin/smddp-bench -o $4 -b 64 -e 256K -f 8 -n 1000 -w 100 -c 1 2>&1 | grep -E "^ +[0-9]+ |rror"
}
for r in 1 2 3; do for p in shm "tcp;ofi_rxm"; do for k in 1 2; do for o in gather scatter alltoall; do
  for v in $(order $r); do across $v "$p" $k $o; done; done; done; done; done > $OUT/across_small.log 2>&1
cat $OUT/check/summary.json; grep -E "passed|failed" $OUT/check/gpu_multinode.log | tail -2
gzip -c $OUT/across_small.log > $OUT/across_small.log.gz; rm -f $OUT/across_small.log
rm -f $OUT/check/CMakeCache.txt $OUT/check/configure.log
