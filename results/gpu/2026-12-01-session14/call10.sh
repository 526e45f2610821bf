#!/bin/bash
# Session 14 call 10 (one H200 host, 16 cores): the session's daemon (new, HEAD)
# against the session start's (old, 5b53294), across 2 simulated nodes: host tensors
# over shm and tcp (allreduce; allgather over shm), then CUDA tensors over shm.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
bn=$PWD/build-new
(cmake -S . -B $bn -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_new.log 2>&1 && \
 cmake --build $bn -j16 --target smddp-daemon smddp-bench smddprun smddp_torch_plugin > /tmp/build_new.log 2>&1) || { echo "new build failed"; tail -20 /tmp/build_new.log; exit 1; }
(cmake -S devtmp/old -B build-old -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_old.log 2>&1 && \
 cmake --build build-old -j16 --target smddp-daemon > /tmp/build_old.log 2>&1) || { echo "old build failed"; tail -20 /tmp/build_old.log; exit 1; }
bench() {  # variant provider [more smddprun args]
  local v=$1 p=$2; shift 2; echo "== $v $p $*"
  timeout 120 $bn/bin/smddprun --daemon $PWD/build-$v/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 --config configs/local.ini --set "fabric.provider=$p" "$@" -- $bn/bin/smddp-bench -o allreduce -b 1M -e 64M -f 4 -n 20 -w 3 -c 1 2>&1 | grep -E "^ +[0-9]+ |rror"
}
for r in 1 2 3; do for v in old new; do bench $v shm; done; done > $OUT/host_shm.log 2>&1
for r in 1 2; do for v in old new; do bench $v "tcp;ofi_rxm"; done; done > $OUT/host_tcp.log 2>&1
agbench() {
  local v=$1; echo "== allgather $v shm"
  timeout 120 $bn/bin/smddprun --daemon $PWD/build-$v/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 --config configs/local.ini --set fabric.provider=shm -- $bn/bin/smddp-bench -o allgather -b 1M -e 64M -f 4 -n 20 -w 3 -c 1 2>&1 | grep -E "^ +[0-9]+ |rror"
}
for r in 1 2; do for v in old new; do agbench $v; done; done > $OUT/host_shm_ag.log 2>&1
staged() {
  echo "== staged daemon $1"
  env MIXED=1 MODES=sync SIZES=1048576,4194304,16777216,67108864 ITERS=40 SKIP_CPU=1 PYTHONPATH=$bn/python timeout 150 \
    $bn/bin/smddprun --daemon $PWD/build-$1/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 --set fabric.provider=shm -- $py -u results/gpu/2026-12-01-session13/staged_cpu.py 2>&1 | grep -E "^sync|rror"
}
for r in 1 2; do for v in old new; do staged $v; done; done > $OUT/staged.log 2>&1
for f in host_shm host_tcp host_shm_ag staged; do echo "#### $f"; cat $OUT/$f.log; done
