#!/usr/bin/env bash
# Runs the benchmark's middle sizes once per fast-path limit (SMDDP_FAST_MAX_BYTES), to place
# the limit where the fast path stops beating the plan path (2 ranks; on the GPU machine).
#   scripts/diag/fast_limit_sweep.sh BUILD OUTDIR LIMIT...
set -uo pipefail
build="$1"; out="$2"; shift 2
py="$(command -v python3)"
for limit in "$@"; do
  SMDDP_FAST_MAX_BYTES="$limit" timeout 120 "$py" scripts/bench_torch.py --build "$build" \
    --ops allreduce,allgather,allgather_kernel,reducescatter --min 1M --max 64M --factor 2 >"$out/fast_limit_$limit.log" 2>&1
  echo "limit $limit: rc=$?"
done
