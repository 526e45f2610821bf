#!/bin/bash
# Session 12 call 1 (one H200): how soon the host learns a copy finished (fence_probe), and CUDA
# against host tensors across 2 simulated nodes sharing the GPU, 8 B to 4 MiB (baseline).
set -u
export PATH=/opt/torch/.venv/bin:$PATH
py=$(command -v python3)
b=$PWD/build-device
OUT=$OUT scripts/device-check.sh --quick --no-bench --skip gpu_collectives,gpu_capture,gpu_training,latency_probe,gpu_multinode > $OUT/dc.out 2>&1
cat $OUT/dc.out
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
$nvcc -O2 -arch=sm_90 -std=c++17 -o /tmp/fence_probe scripts/diag/fence_probe.cu -lcuda -lpthread > $OUT/fence_build.log 2>&1 || tail -5 $OUT/fence_build.log
nvidia-smi -L
timeout 120 /tmp/fence_probe 2000 > $OUT/fence_probe.log 2>&1; echo "fence_probe rc=$?"; cat $OUT/fence_probe.log
for i in 1 2; do
  timeout 150 $py scripts/bench_torch.py --build $b --simulate-nodes 2 --nproc 2 --ops allreduce,allgather,reducescatter \
    --min 8 --max 4M --factor 4 --json $OUT/multinode_small_$i.json > $OUT/multinode_small_$i.log 2>&1
  echo "bench $i rc=$?"; pkill -x smddp-daemon
done
cat $OUT/multinode_small_1.log; grep -v '^#' $OUT/multinode_small_2.log | head -60
rm -f $OUT/CMakeCache.txt $OUT/configure.log $OUT/env.log $OUT/summary.json
