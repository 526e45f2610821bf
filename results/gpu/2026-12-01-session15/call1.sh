#!/bin/bash
# Session 15 call 1 (one H200 host, 16 cores): small operations across 2 simulated nodes sent
# with their descriptors (c199687, "new") against the session start's daemon (80b9b58, "old",
# built from devtmp/old). First the GPU suite across nodes on the new code (device-check
# --quick, every collective and dtype with CUDA tensors through the fabric path), then latency
# of host-tensor AllReduce and AllGather over shm and tcp (three rounds, alternating), then
# CUDA-tensor AllReduce across the nodes (the staged path; two rounds).
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
OUT=$OUT/check scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_training,latency_probe,gpu_capture \
  > $OUT/check.log 2>&1; echo "device-check rc=$?"
bn=$PWD/build-device
cmake --build $bn -j16 --target smddp-bench > /tmp/build_bench.log 2>&1 || { echo "bench build failed"; tail -20 /tmp/build_bench.log; exit 1; }
(cmake -S devtmp/old -B build-old -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_old.log 2>&1 && \
 cmake --build build-old -j16 --target smddp-daemon > /tmp/build_old.log 2>&1) || { echo "old build failed"; tail -20 /tmp/build_old.log; exit 1; }
daemon() { [ $1 = old ] && echo $PWD/build-old/bin/smddp-daemon || echo $bn/bin/smddp-daemon; }
bench() {  # variant provider op
  echo "== $1 $2 $3"
  timeout 120 $bn/bin/smddprun --daemon $(daemon $1) --simulate-nodes 2 --nproc-per-node 1 --config configs/local.ini \
    --set "fabric.provider=$2" -- $bn/bin/smddp-bench -o $3 -b 8 -e 256K -f 8 -n 1000 -w 100 -c 1 2>&1 | grep -E "^ +[0-9]+ |rror"
}
for r in 1 2 3; do for p in shm "tcp;ofi_rxm"; do for o in allreduce allgather; do
  if [ $r = 2 ]; then order="new old"; else order="old new"; fi
  for v in $order; do bench $v "$p" $o; done
done; done; done > $OUT/host_small.log 2>&1
staged() {
  echo "== staged daemon $1"
  env MODES=sync SIZES=8,4096,32768,262144 ITERS=400 SKIP_CPU=1 PYTHONPATH=$bn/python timeout 150 \
    $bn/bin/smddprun --daemon $(daemon $1) --simulate-nodes 2 --nproc-per-node 1 --set fabric.provider=shm -- \
    $py -u results/gpu/2026-12-01-session13/staged_cpu.py 2>&1 | grep -E "^sync|rror"
}
for r in 1 2; do for v in old new; do staged $v; done; done > $OUT/staged_small.log 2>&1
cat $OUT/check/summary.json; for f in host_small staged_small; do echo "#### $f"; cat $OUT/$f.log; done
