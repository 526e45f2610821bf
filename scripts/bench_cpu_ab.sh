#!/usr/bin/env bash
# Two smddp settings (or builds) side by side with Open MPI, in alternating rounds, for a noisy
# machine: each round runs A and B (A first in odd rounds, B first in even ones), then Open MPI
# over the same sizes, and the report gives per size the median time of the rounds and their
# range. On 2 cores the same run varies by up to 2x from one minute to the next; alternating
# keeps the comparison fair.
#
#   scripts/bench_cpu_ab.sh --op allreduce --ranks 2 --rounds 5 \
#       --a "--set daemon.split_reduce_min_kib=0" --b "--set daemon.split_reduce_min_kib=off"
#   scripts/bench_cpu_ab.sh --op allgather --build-b ../old/build      # the previous build as B
#
# Open MPI runs with its single copy off (btl_vader_single_copy_mechanism none, as in containers
# without ptrace rights); --mpi-cma adds a run with it on (cma: process_vm_readv, as smddp's
# single copy), its column "MPI cma".
#
# Raw lines ("A|B|mpi bytes us") go to RESULTS/OP-Nr.raw, the table to RESULTS/OP-Nr.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

op=allreduce ranks=2 rounds=5 min=64K max=16M factor=4 iters=100 warmup=10 dtype=float32
build_a=build build_b=build args_a="" args_b="" results="results/$(date +%F)-cpu-ab" mpi_cma=0
usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  cat <<EOF
options:
  --op OP --ranks N --rounds N --min SIZE --max SIZE --factor F --iters N --warmup N --dtype T
  --build-a DIR --build-b DIR   build trees (both: $build_a)
  --a STR --b STR               extra smddprun options of A and of B
  --results DIR                 where the raw lines and the table go ($results)
  --mpi-cma                     also Open MPI with its single copy (CMA) on
EOF
}
while [ $# -gt 0 ]; do
  case "$1" in
    --op) op="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --min) min="$2"; shift 2 ;;
    --max) max="$2"; shift 2 ;;
    --factor) factor="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --dtype) dtype="$2"; shift 2 ;;
    --build-a) build_a="$2"; shift 2 ;;
    --build-b) build_b="$2"; shift 2 ;;
    --a) args_a="$2"; shift 2 ;;
    --b) args_b="$2"; shift 2 ;;
    --results) results="$2"; shift 2 ;;
    --mpi-cma) mpi_cma=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench_cpu_ab.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
for b in "$build_a" "$build_b"; do
  for t in smddprun smddp-bench mpi-bench; do
    [ -x "$b/bin/$t" ] || { echo "bench_cpu_ab.sh: $b/bin/$t is missing (build it first)" >&2; exit 2; }
  done
done
mkdir -p "$results"
raw="$results/$op-${ranks}r.raw"
: >"$raw"
sweep=(-o "$op" -b "$min" -e "$max" -f "$factor" -n "$iters" -w "$warmup" -c 0 -d "$dtype")
# The data lines of an nccl-tests-style report: size in bytes first, time in us sixth.
keep() { awk -v t="$1" '/^ +[0-9]/ {print t, $1, $6}'; }
run_a() {
  # shellcheck disable=SC2086  # the extra options are words
  "$build_a/bin/smddprun" --nproc-per-node "$ranks" $args_a -- "$build_a/bin/smddp-bench" "${sweep[@]}" | keep A >>"$raw"
}
run_b() {
  # shellcheck disable=SC2086
  "$build_b/bin/smddprun" --nproc-per-node "$ranks" $args_b -- "$build_b/bin/smddp-bench" "${sweep[@]}" | keep B >>"$raw"
}
for i in $(seq "$rounds"); do
  echo "== round $i of $rounds"
  # Whichever runs first in a round measured up to 15% slower on the 16-core host (the same build
  # against itself: 0.96-1.16), so odd rounds run A first and even rounds B.
  if [ $((i % 2)) -eq 1 ]; then run_a; run_b; else run_b; run_a; fi
  mpirun -np "$ranks" --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
    --bind-to none --allow-run-as-root "$build_a/bin/mpi-bench" "${sweep[@]}" | keep mpi >>"$raw"
  if [ "$mpi_cma" = 1 ]; then
    mpirun -np "$ranks" --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism cma \
      --bind-to none --allow-run-as-root "$build_a/bin/mpi-bench" "${sweep[@]}" | keep mpicma >>"$raw"
  fi
done
python3 - "$raw" "$results/$op-${ranks}r.md" "$op" "$ranks" "$rounds" "A: $build_a $args_a" "B: $build_b $args_b" <<'PY'
import collections, statistics, sys
raw, md, op, ranks, rounds, a, b = sys.argv[1:]
t = collections.defaultdict(list)
for line in open(raw):
    who, size, us = line.split()
    t[(who, int(size))].append(float(us))
def cell(who, s):
    v = t.get((who, s))
    if not v:
        return "-"
    f = "%.1f (%.1f-%.1f)" if max(v) < 100 else "%.1f (%.0f-%.0f)"  # small times: the tenths matter
    return f % (statistics.median(v), min(v), max(v))
def ratio(x, y, s):
    return "%.2f" % (statistics.median(t[(y, s)]) / statistics.median(t[(x, s)])) if t.get((x, s)) and t.get((y, s)) else "-"
lines = ["%s, %s ranks, median of %s rounds (range), us per call; ratios: the other's time / A's" % (op, ranks, rounds),
         "", "- " + a, "- " + b, "",
         "| bytes | A | B | Open MPI | B/A | MPI/A |", "|---:|---:|---:|---:|---:|---:|"]
cma = any(who == "mpicma" for who, _ in t)
if cma:
    lines[-2] = "| bytes | A | B | Open MPI | MPI cma | B/A | MPI/A | MPI cma/A |"
    lines[-1] = "|---:|---:|---:|---:|---:|---:|---:|---:|"
for s in sorted({s for _, s in t}):
    if cma:
        lines.append("| %d | %s | %s | %s | %s | %s | %s | %s |" % (s, cell("A", s), cell("B", s), cell("mpi", s), cell("mpicma", s),
                     ratio("A", "B", s), ratio("A", "mpi", s), ratio("A", "mpicma", s)))
    else:
        lines.append("| %d | %s | %s | %s | %s | %s |" % (s, cell("A", s), cell("B", s), cell("mpi", s), ratio("A", "B", s), ratio("A", "mpi", s)))
open(md, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
