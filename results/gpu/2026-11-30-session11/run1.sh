#!/bin/bash
# Session 11 call 1: build, the capture test (new code), then the same worker against the
# previous code (this tree with devtmp/capture.patch reversed), each part alone.
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_training,latency_probe,gpu_multinode > $OUT/dc.out 2>&1
echo "device-check rc=$?"
t0=$(date +%s)
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=./build-device -cf - . | tar -xf - -C /tmp/old
(cd /tmp/old && patch -s -R -p1 < devtmp/capture.patch && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/old_configure.log 2>&1 && cmake --build build -j16 --target smddp-daemon smddp-ctl smddp_torch_plugin smddprun > $OUT/old_build.log 2>&1)
echo "old build rc=$? in $(( $(date +%s) - t0 )) s"
ob=/tmp/old/build
for part in beside refusal; do
  echo "== previous code, $part only"
  SMDDP_TEST_CAPTURE_ONLY=$part SMDDP_BUILD_DIR=$ob SMDDP_TEST_PYTHON=$py PYTHONPATH=$ob/python \
    timeout 130 $py -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_capture.py -k rank 2>&1 | grep -v "^$" | tail -60
  echo "rc=${PIPESTATUS[0]}"
done > $OUT/old_capture.log 2>&1
pkill -x smddp-daemon; pkill -f gpu_capture_worker
tail -5 $OUT/old_capture.log
cat $OUT/gpu_capture.log | tail -30
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/build.log $OUT/old_configure.log
