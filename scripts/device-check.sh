#!/usr/bin/env bash
# One call on the GPU machine (through the device tool): builds with that machine's
# toolchain and torch, runs the unit, integration and Python suites (GPU tests included;
# they skip on a CPU machine), then the benchmarks when asked, and writes every log plus a
# JSON summary under $OUT (default ./device-out).
#
#   scripts/device-check.sh [--no-bench] [--only LABELS]
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
OUT="${OUT:-$here/device-out}"
mkdir -p "$OUT"
bench=1
labels='unit|integration|python|gpu'
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) bench=0 ;;
    --only) labels="$2"; shift ;;
    *) echo "unknown option $1"; exit 2 ;;
  esac
  shift
done
jobs=$(nproc)
build="$here/build-device"
summary="$OUT/summary.json"
declare -A step_rc

step() {  # step NAME COMMAND...: runs it with its log in $OUT/NAME.log
  local name="$1"; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  step_rc[$name]=$?
  echo "$name: rc=${step_rc[$name]} ($((SECONDS - t0)) s)"
}

{
  echo "date: $(date -u +%FT%TZ)"; uname -a; nvidia-smi -L 2>&1; nvidia-smi topo -m 2>&1 | head -8
  g++ --version | head -1; cmake --version | head -1; command -v nvcc && nvcc --version | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1
  mpirun --version 2>&1 | head -1
} >"$OUT/env.log" 2>&1

step configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
step build cmake --build "$build" -j"$jobs"
if [ "${step_rc[build]}" -eq 0 ]; then
  step tests ctest --test-dir "$build" -L "$labels" -j1 --output-on-failure --timeout 900
  if [ "$bench" -eq 1 ] && [ -x scripts/bench_gpu.sh ]; then
    step bench scripts/bench_gpu.sh --build "$build" --results "$OUT/bench"
  fi
fi
cp "$build/CMakeCache.txt" "$OUT/" 2>/dev/null || true

{
  echo "{"
  first=1
  for k in "${!step_rc[@]}"; do
    [ $first -eq 1 ] || echo ","
    first=0
    printf '  "%s": %s' "$k" "${step_rc[$k]}"
  done
  echo
  echo "}"
} >"$summary"
cat "$summary"
grep -E "tests passed|tests failed" "$OUT/tests.log" 2>/dev/null || true
