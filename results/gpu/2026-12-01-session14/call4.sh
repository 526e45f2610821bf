#!/bin/bash
# Session 14 call 3 (one H200 host, 16 cores): the daemon polling on while a rank is in the
# middle of a chunked operation (new) against HEAD (old), and with the client spinning 2 ms
# before it sleeps (cspin), across 2 simulated nodes: host tensors over shm and tcp, then CUDA
# tensors (rank 0; rank 1 host) over shm.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
bn=$PWD/build-new
(cmake -S . -B $bn -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_new.log 2>&1 && \
 cmake --build $bn -j16 --target smddp-daemon smddp-bench smddprun smddp_torch_plugin > /tmp/build_new.log 2>&1) || { echo "new build failed"; tail -20 /tmp/build_new.log; exit 1; }
for v in old cspin; do
  (cmake -S devtmp/$v -B build-$v -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_$v.log 2>&1 && \
   cmake --build build-$v -j16 --target smddp-daemon smddp-bench > /tmp/build_$v.log 2>&1) || { echo "$v build failed"; tail -20 /tmp/build_$v.log; exit 1; }
done
bench() {  # variant provider
  local b=$PWD/build-$1; echo "== $1 $2"; TIMEFORMAT="wall %R user %U sys %S"
  time timeout 120 $bn/bin/smddprun --daemon $b/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 --config configs/local.ini --set "fabric.provider=$2" -- $b/bin/smddp-bench -o allreduce -b 1M -e 64M -f 4 -n 20 -w 3 -c 1 2>&1 | grep -E "^ +[0-9]+ |rror"
}
for r in 1 2; do for v in old new cspin; do bench $v shm; done; done > $OUT/host_shm.log 2>&1
for r in 1 2; do for v in old new; do bench $v "tcp;ofi_rxm"; done; done > $OUT/host_tcp.log 2>&1
staged() {  # daemon variant
  echo "== staged daemon $1"
  env MIXED=1 MODES=sync SIZES=1048576,4194304,16777216,67108864 ITERS=40 SKIP_CPU=1 PYTHONPATH=$bn/python timeout 150 \
    $bn/bin/smddprun --daemon $PWD/build-$1/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 --set fabric.provider=shm -- $py -u results/gpu/2026-12-01-session13/staged_cpu.py 2>&1 | grep -E "^sync|rror"
}
for r in 1 2; do for v in old new; do staged $v; done; done > $OUT/staged.log 2>&1
cat $OUT/host_shm.log $OUT/host_tcp.log $OUT/staged.log
