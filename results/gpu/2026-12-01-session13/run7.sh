#!/bin/bash
# Session 13 call 7 (one H200): ops chained on one tensor. The final code: the copier test and
# the suite across 2 simulated nodes sharing the GPU (its new check: two async ops back to back
# on one CUDA tensor); then the same suite with the previous build (9ebc5fa, devtmp/old), whose
# copies of the second op did not follow the first one's: the new check should fail there.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_capture,gpu_training,latency_probe > $OUT/dc.out 2>&1
echo "device-check rc=$?"; cat $OUT/dc.out | head -9; nvidia-smi -L
grep -E "chained|passed|failed|SMDDP-DONE" $OUT/gpu_multinode.log | head -8
(cmake -S devtmp/old -B build-old -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg_old.log 2>&1 && \
 cmake --build build-old -j16 --target smddp-daemon smddp_torch_plugin smddprun > /tmp/build_old.log 2>&1) || { echo "old build failed"; tail -20 /tmp/build_old.log; }
b=$PWD/build-old
SMDDP_BUILD_DIR=$b SMDDP_TEST_PYTHON=$py PYTHONPATH=$b/python SMDDP_HAVE_FABRIC=ON timeout 150 $py -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_gpu_multinode.py -k sharing > $OUT/gpu_multinode_old.log 2>&1
echo "old multinode rc=$?"; grep -E "chained" $OUT/gpu_multinode_old.log | head -4; tail -2 $OUT/gpu_multinode_old.log
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/build.log
