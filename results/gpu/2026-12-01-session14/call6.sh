#!/bin/bash
# Session 14 call 6 (one H200 host, 16 cores): where a 16 MiB allreduce across 2 simulated nodes
# spends its time: the daemons' trace of each step (log_level=trace), host tensors, shm and tcp.
set -u
bn=$PWD/build-new
(cmake -S . -B $bn -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_new.log 2>&1 && \
 cmake --build $bn -j16 --target smddp-daemon smddp-bench smddprun > /tmp/build_new.log 2>&1) || { echo "new build failed"; tail -20 /tmp/build_new.log; exit 1; }
for p in shm "tcp;ofi_rxm"; do
  f=$OUT/trace_${p%%;*}.log
  timeout 60 $bn/bin/smddprun --simulate-nodes 2 --nproc-per-node 1 --config configs/local.ini --set "fabric.provider=$p" --set daemon.log_level=trace -- $bn/bin/smddp-bench -o allreduce -b 16M -e 16M -n 6 -w 2 -c 0 > $f 2>&1
  echo "== $p rc=$?"; grep -E "^ +[0-9]+ " $f
done
gzip -9 $OUT/*.log
