#!/bin/bash
# Session 11 call 2: build; the capture test in both execution modes; training parity
# (smddprun, torchrun); the capture worker's part 2 against the previous code (this tree with
# devtmp/capture.patch reversed); then the collectives through smddprun and daemon-executed.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,latency_probe,gpu_multinode > $OUT/dc.out 2>&1
cat $OUT/dc.out
grep -E "error|Error" $OUT/build.log | head -20
t0=$(date +%s)
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=./build-device -cf - . | tar -xf - -C /tmp/old
(cd /tmp/old && patch -s -R -p1 < devtmp/capture.patch && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null 2>&1 && cmake --build build -j16 --target smddp-daemon smddp-ctl smddp_torch_plugin smddprun > $OUT/old_build.log 2>&1)
echo "old build rc=$? in $(( $(date +%s) - t0 )) s"
ob=/tmp/old/build
{
  echo "== previous code, beside only (frees each round)"
  SMDDP_TEST_CAPTURE_ONLY=beside SMDDP_BUILD_DIR=$ob SMDDP_TEST_PYTHON=$py PYTHONPATH=$ob/python \
    timeout 130 $py -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_capture.py 2>&1 | grep -E "SMDDP-CHECK|passed|failed|rc=" | cut -c1-600
} > $OUT/old_capture.log 2>&1
cat $OUT/old_capture.log
pkill -x smddp-daemon
SMDDP_BUILD_DIR=$b SMDDP_TEST_PYTHON=$py PYTHONPATH=$b/python timeout 230 $py -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_gpu_collectives.py -k "smddprun or daemon_exec" > $OUT/coll.log 2>&1
tail -3 $OUT/coll.log
tail -3 $OUT/gpu_capture.log $OUT/gpu_training.log
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json
