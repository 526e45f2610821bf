#!/usr/bin/env bash
# Across nodes, one machine: 2 simulated nodes x 1 rank. smddp (smddprun --simulate-nodes 2,
# daemons over libfabric tcp;ofi_rxm on loopback) beside Open MPI with TCP only and gloo.
# Results in results/<today>-multinode-bench/ (raw reports in raw/, tables in bench_multinode.md);
# --results DIR puts them elsewhere.
# Not part of scripts/test.sh: it takes minutes and measures, it does not check.
#   scripts/bench_multinode.sh [bench_cpu.sh options, e.g. --max 64M --iters 5]
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "$here/scripts/bench_cpu.sh" --nodes 2 --ranks 2 --ops allreduce,allgather --min 1K --max 256M --factor 4 \
  --iters 10 --warmup 3 --results "$here/results/$(date -u +%F)-multinode-bench" --md bench_multinode.md \
  --smddprun-args "--config $here/configs/local.ini" "$@"
