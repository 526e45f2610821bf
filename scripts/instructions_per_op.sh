#!/usr/bin/env bash
# Instructions one host collective costs a rank, counted by valgrind's callgrind: the same
# smddp-bench job at N and 2N iterations, the difference divided by N (start-up cancels out),
# and the functions the extra N spent them in. Exact and independent of the machine's load, so
# it compares builds on a noisy 2-core machine where timings cannot. One rank by default: no
# peer to wait for, so every instruction is the call's own work.
#
#   scripts/instructions_per_op.sh [--build DIR] [--op allreduce] [--bytes 8] [--ranks 1] [--iters 20000]
#
# Needs valgrind (Debian's `valgrind`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build" op=allreduce bytes=8 ranks=1 iters=20000 top=25
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --op) op="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --top) top="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "instructions_per_op.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
command -v valgrind >/dev/null || { echo "instructions_per_op.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
count() {  # $1: iterations; writes $work/cg.$1.<pid> per rank, prints rank 0's total
  "$build/bin/smddprun" --nproc-per-node "$ranks" -- valgrind --tool=callgrind \
    --callgrind-out-file="$work/cg.$1.%p" "$build/bin/smddp-bench" -o "$op" -b "$bytes" -e "$bytes" -n "$1" -w 100 -c 0 \
    >/dev/null 2>&1
  local f
  f="$(ls "$work"/cg."$1".* | head -1)"
  callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}
a=$(count "$iters")
b=$(count $((2 * iters)))
echo "$op $bytes B, $ranks rank(s): $(( (b - a) / iters )) instructions per call (rank 0; $a at $iters calls, $b at $((2 * iters)))"
echo "functions by their own instructions per call, at $((2 * iters)) calls:"
callgrind_annotate "$(ls "$work"/cg.$((2 * iters)).* | head -1)" 2>/dev/null \
  | awk -v n=$((2 * iters)) -v top="$top" '/PROGRAM TOTALS/ {next}
      /^ *[0-9,]+ \( *[0-9.]+%\)  / && shown < top {
        v = $1; gsub(",", "", v); sub(/^ *[0-9,]+ \( *[0-9.]+%\)  /, "");
        printf "%8.1f  %s\n", v / n, substr($0, 1, 140); shown++ }'
