#!/bin/bash
# Session 14 call 1 (one H200): profile of small synchronous allreduces of a CUDA tensor across 2
# simulated nodes (tcp over loopback), rank 0 CUDA, rank 1 host.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-new
(cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg.log 2>&1 && \
 cmake --build $b -j16 --target smddp-daemon smddp_torch_plugin smddprun > /tmp/build.log 2>&1) || { echo "build failed"; tail -20 /tmp/build.log; exit 1; }
for s in 8 131072; do
  for prov in "" "--set fabric.provider=shm"; do
    echo "== size $s $prov"
    env SIZE=$s OUT=$OUT PYTHONPATH=$b/python timeout 120 $b/bin/smddprun --daemon $b/bin/smddp-daemon --simulate-nodes 2 --nproc-per-node 1 $prov -- $py -u devtmp/staged_profile.py > /tmp/p.log 2>&1
    echo "rc=$?"; grep -E "round|Error|error" /tmp/p.log | head -8
    [ -n "$prov" ] && mv $OUT/trace_$s.json $OUT/trace_${s}_shm.json 2>/dev/null
  done
done
gzip -9 $OUT/*.json; ls -la $OUT
