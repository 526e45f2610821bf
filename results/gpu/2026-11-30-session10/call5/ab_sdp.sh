#!/usr/bin/env bash
# One-off A/B for session 10 (not committed): the SDP static-flag graph against its parent.
set -uo pipefail
export PATH=/opt/torch/.venv/bin:$PATH
b=$PWD/build-device; py=$(command -v python3)
OUT=$OUT scripts/device-check.sh --quick --skip gpu_collectives,gpu_training,latency_probe,gpu_multinode,bench_sweep,bench_overlap,overlap_floor,bench_multinode > $OUT/dc.out 2>&1
grep -E "rc=" $OUT/dc.out
rm -rf /tmp/old && mkdir -p /tmp/old && tar --exclude=./build-device -cf - . | tar -xf - -C /tmp/old
(cd /tmp/old && patch -s -R -p1 < sdp_new.patch && cmake -S . -B build-old -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null && cmake --build build-old -j32 --target smddp-daemon smddp-ctl smddp_torch_plugin smddprun > /dev/null) && echo old built
probe() {  # probe BUILD LOG
  env PYTHONPATH="$1/python" SMDDP_BIN_DIR="$1/bin" timeout 120 "$1/bin/smddprun" --daemon "$1/bin/smddp-daemon" \
    --nproc-per-node 2 -- "$py" scripts/diag/sdp_latency_probe.py 500 >> "$2" 2>&1
}
for i in 1 2; do
  echo "== new run $i" >> $OUT/probes.log; probe $b $OUT/probes.log
  echo "== old run $i" >> $OUT/probes.log; probe /tmp/old/build-old $OUT/probes.log
done
echo probes done
SMDDP_BUILD_DIR=$b SMDDP_TEST_PYTHON=$py PYTHONPATH=$b/python timeout 300 $py -m pytest -x -q -rs -p no:cacheprovider \
  tests/gpu/test_gpu_collectives.py -k "smddprun or expandable or disagreement" > $OUT/coll.log 2>&1
echo coll rc=$?; tail -2 $OUT/coll.log
timeout 200 $py scripts/bench_torch.py --build $b --min 8 --max 1G --factor 2 > $OUT/bench_sweep.log 2>&1
echo sweep rc=$?
rm -rf $OUT/CMakeCache.txt $OUT/summary.json $OUT/env.log $OUT/configure.log $OUT/bench $OUT/build.log
