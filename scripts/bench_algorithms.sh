#!/usr/bin/env bash
# The algorithms across nodes side by side: smddp-bench across K simulated nodes x 1 rank
# (smddprun --simulate-nodes K, the daemons over libfabric tcp;ofi_rxm on loopback), with
# fabric.algorithm forced to direct, ring and halving, and auto (the tuner's choice). Raw reports
# go to RESULTS/raw/OP_KNODES_ALGORITHM.txt, the tables to RESULTS/algorithms.md.
# Measures, does not check (--check 1 to check too); not part of scripts/test.sh: it takes
# minutes. Every simulated node is a daemon and a rank on this machine: with more processes than
# cores the numbers say as much about the scheduler as about the algorithms.
#   scripts/bench_algorithms.sh [--nodes "4 8"] [--ops allreduce,allgather] [--algorithms direct,ring,halving,auto]
#                               [--min 8] [--max 64M] [--factor 4] [--iters 10] [--warmup 3] [--results DIR]
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

build="$here/build"
results="$here/results/algorithms"
node_counts="4 8"
ops="allreduce,allgather"
algorithms="direct,ring,halving,auto"
min=8
max=64M
factor=4
iters=10
warmup=3
check=0
extra=""

while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --results) results="$2"; shift 2 ;;
    --nodes) node_counts="$2"; shift 2 ;;
    --ops) ops="$2"; shift 2 ;;
    --algorithms) algorithms="$2"; shift 2 ;;
    --min) min="$2"; shift 2 ;;
    --max) max="$2"; shift 2 ;;
    --factor) factor="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --check) check="$2"; shift 2 ;;
    --smddprun-args) extra="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "bench_algorithms.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done

smddprun="${SMDDPRUN:-$build/bin/smddprun}"
smddp_bench="${SMDDP_BENCH:-$build/bin/smddp-bench}"
for b in "$smddprun" "$smddp_bench"; do
  [ -x "$b" ] || { echo "bench_algorithms.sh: no $b (build it first)" >&2; exit 2; }
done

mkdir -p "$results/raw"
status=0
for k in $node_counts; do
  for op in ${ops//,/ }; do
    for a in ${algorithms//,/ }; do
      out="$results/raw/${op}_${k}nodes_${a}.txt"
      cmd=("$smddprun" --simulate-nodes "$k" --nproc-per-node 1 --config "$here/configs/local.ini"
           --set "fabric.algorithm=$a")
      # shellcheck disable=SC2206  # extra is a list of options on purpose
      cmd+=($extra -- "$smddp_bench" -o "$op" -b "$min" -e "$max" -f "$factor" -n "$iters" -w "$warmup" -c "$check" -d float32)
      echo "bench_algorithms.sh: $op, $k nodes, $a" >&2
      { echo "# command: ${cmd[*]}"; "${cmd[@]}" 2>&1; } >"$out" || {
        echo "bench_algorithms.sh: $op $k nodes $a failed (see $out)" >&2
        status=1
      }
    done
  done
done

note="$(date -u +%Y-%m-%d), $(nproc) CPU core(s) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), 1 rank per node, float32, host buffers; sizes $min..$max x$factor, $warmup warmup + $iters timed iterations."
python3 "$here/scripts/algorithms_table.py" --raw "$results/raw" --nodes "$node_counts" --ops "$ops" \
  --algorithms "$algorithms" --note "$note" >"$results/algorithms.md" || status=1
echo "bench_algorithms.sh: tables in $results/algorithms.md" >&2
exit "$status"
