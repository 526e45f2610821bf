#!/usr/bin/env bash
# GPU benchmarks for device-check.sh: smddp vs NCCL through torch.distributed (latency and
# busbw from 8 B to 1 GiB, then the matmul-overlap benchmark), via smddprun and torchrun.
#
#   scripts/bench_gpu.sh --build DIR --results DIR     # RESULTS defaults to results/<today>-gpu-bench/
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build"
results="$here/results/$(date -u +%F)-gpu-bench"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift ;;
    --results) results="$2"; shift ;;
    *) echo "unknown option $1"; exit 2 ;;
  esac
  shift
done
mkdir -p "$results"
py="$(command -v python3)"
rc=0
"$py" "$here/scripts/bench_torch.py" --build "$build" --min 8 --max 1G --overlap \
  --json "$results/bench_torch_smddprun.json" 2>&1 | tee "$results/bench_torch_smddprun.log" || rc=1
"$py" "$here/scripts/bench_torch.py" --build "$build" --launcher torchrun --min 8 --max 64M --ops allreduce \
  --json "$results/bench_torch_torchrun.json" 2>&1 | tee "$results/bench_torch_torchrun.log" || rc=1
exit $rc
