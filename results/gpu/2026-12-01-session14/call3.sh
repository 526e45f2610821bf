#!/bin/bash
# Session 14 call 2 (one H200 host, 16 cores): host tensors across 2 simulated nodes, how the
# internode path scales with size (shm and tcp providers), beside the raw transport.
set -u
which perf strace gdb; nproc
b=$PWD/build-new
(cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg.log 2>&1 && \
 cmake --build $b -j16 --target smddp-daemon smddp-bench smddprun fabric_pingpong > /tmp/build.log 2>&1) || { echo "build failed"; tail -20 /tmp/build.log; exit 1; }
echo "== pingpong shm"; timeout 60 $b/bin/fabric_pingpong --provider shm --iters 50 2>&1 | tail -11
echo "== pingpong tcp"; timeout 60 $b/bin/fabric_pingpong --provider "tcp;ofi_rxm" --interface lo --iters 50 2>&1 | tail -11
bench() { echo "== $*"; TIMEFORMAT="wall %R user %U sys %S"; time timeout 120 $b/bin/smddprun --daemon $b/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 --config configs/local.ini "$@" -- $b/bin/smddp-bench -o allreduce -b 1M -e 64M -f 4 -n 20 -w 3 -c 1 2>&1 | grep -E "^ +[0-9]+ |rror"; }
bench --set fabric.provider=shm
bench --set "fabric.provider=tcp;ofi_rxm"
bench --set fabric.provider=shm --set daemon.arena_mib=256
bench --set fabric.provider=shm --set daemon.chunk_kib=4096 --set daemon.arena_mib=256
bench --set fabric.provider=shm --set daemon.spin_us=100000
echo "== one node, 2 ranks"; timeout 120 $b/bin/smddprun --daemon $b/bin/smddp-daemon --nproc-per-node 2 --config configs/local.ini -- $b/bin/smddp-bench -o allreduce -b 1M -e 64M -f 4 -n 20 -w 3 -c 1 2>&1 | grep -E "^ +[0-9]+ |rror"
