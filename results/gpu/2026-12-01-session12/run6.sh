#!/bin/bash
# Session 12 call 6 (one H200): barrier() refused inside a CUDA graph capture. The capture
# worker in a world of one rank; the suite across 2 simulated nodes sharing the GPU; the host
# tensors' suites that call barrier (torch 2.11).
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_capture,gpu_training,latency_probe,gpu_multinode > $OUT/dc.out 2>&1
cat $OUT/dc.out | head -3
[ -s $OUT/build.log ] && grep -E 'error|FAILED' $OUT/build.log | head
envs="SMDDP_BUILD_DIR=$b SMDDP_TEST_PYTHON=$py PYTHONPATH=$b/python SMDDP_BIN_DIR=$b/bin"
env $envs SMDDP_TEST_STACKS_AFTER=60 timeout 200 $py -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_capture.py > $OUT/gpu_capture.log 2>&1
echo "capture rc=$?"; tail -3 $OUT/gpu_capture.log
grep -E 'FAIL|Error' $OUT/gpu_capture.log | head -20
env $envs SMDDP_HAVE_FABRIC=ON timeout 200 $py -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_multinode.py > $OUT/gpu_multinode.log 2>&1
echo "multinode rc=$?"; tail -2 $OUT/gpu_multinode.log
env $envs timeout 200 $py -m pytest -q -rs -p no:cacheprovider tests/python/test_collectives.py tests/python/test_subgroups.py tests/python/test_v1_api.py > $OUT/python.log 2>&1
echo "python rc=$?"; tail -3 $OUT/python.log
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json
