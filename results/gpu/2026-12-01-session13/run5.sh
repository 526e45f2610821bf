#!/bin/bash
# Session 13 call 5 (one H200): the new arena copier test and the GPU suites one GPU can run
# (device-check --quick: gpu_copier, gpu_capture in a world of one, gpu_multinode sharing the
# GPU); then the copier test against a copy whose fences' host functions sit on the lanes
# (as before this session): its last case must fail.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_training,latency_probe > $OUT/dc.out 2>&1
echo "device-check rc=$?"; cat $OUT/dc.out; nvidia-smi -L
tail -15 $OUT/gpu_copier.log
(cmake -S devtmp/onlane -B build-onlane -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /tmp/cfg.log 2>&1 && \
 cmake --build build-onlane -j16 --target arena_copier_tests > /tmp/build_onlane.log 2>&1) || { echo "onlane build failed"; tail -20 /tmp/build_onlane.log; }
timeout 60 build-onlane/bin/arena_copier_tests > $OUT/copier_onlane.log 2>&1; echo "onlane copier tests rc=$?"
grep -E "OK|FAILED|Failure|waited" $OUT/copier_onlane.log | head -20
tail -4 $OUT/gpu_capture.log; tail -3 $OUT/gpu_multinode.log
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/build.log
