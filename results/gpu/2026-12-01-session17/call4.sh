#!/bin/bash
# Session 17 call 4 (one H200 host): the suites one GPU can run, on the final code: the arena
# copier, every collective and dtype with CUDA tensors across 2 simulated nodes (device-check
# --quick), then the Python suites under torch 2.11 (host tensors through the plugin: DDP,
# collectives, errors, failures, subgroups, torchrun...), whose byte-moving host collectives
# now take the ranks' reads from the members' arenas.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
t0=$SECONDS
OUT=$OUT/check scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_training,latency_probe,gpu_capture \
  > $OUT/check.log 2>&1; echo "device-check rc=$? ($((SECONDS - t0)) s)"
cmake --build build-device -j16 > $OUT/build_all.log 2>&1; echo "full build rc=$? ($((SECONDS - t0)) s)"
timeout 300 ctest --test-dir build-device -L python -j3 --output-on-failure > $OUT/python.log 2>&1
echo "python suites rc=$? ($((SECONDS - t0)) s)"; grep -E "tests passed|Failed|Passed|Skipped|\*\*\*" $OUT/python.log | tail -25
cat $OUT/check/summary.json; rm -f $OUT/check/CMakeCache.txt $OUT/check/configure.log
