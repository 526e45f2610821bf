#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: unit tests, integration tests that
# start real daemons and ranks through smddprun, the Python tests of the plugin, and ASan and
# TSan builds of the ipc, client and daemon tests. GPU tests skip without a GPU.
# Benchmarks are not run here: see scripts/bench_cpu.sh and scripts/device-check.sh.
# `scripts/test.sh --long` runs the long tests instead (label `long`, tens of minutes).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
./scripts/setup.sh
echo "== setup and build took $SECONDS s"

jobs=$(nproc)
if [ "${1:-}" = "--long" ]; then
  # Long runs, kept out of the default (CI) run: every dtype at 64 MiB across simulated nodes,
  # 200 launches back to back, and each fuzz target for minutes.
  long_status=0
  ctest --test-dir build -L long --output-on-failure || long_status=1
  ./scripts/fuzz.sh --long || long_status=1
  exit $long_status
fi
status=0
# Suites with skipped tests write one line each here (tests/python/conftest.py); printed at the end.
rm -rf build/Testing/skips
# Each suite's output is also kept, so that the end of the run can repeat what failed: CI logs
# are often read from the tail.
failures="$(mktemp)"
trap 'rm -f "$failures"' EXIT
run() {
  echo "== $*"
  local out start=$SECONDS
  out="$(mktemp)"
  if ! "$@" 2>&1 | tee "$out"; then
    status=1
    { echo "== $*"; grep -E '^(FAILED|ERROR) |[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Not Run)\)' "$out" || echo "(see above)"; } >>"$failures"
  fi
  rm -f "$out"
  # The run's budget is CI's (under 45 minutes in all): each phase says what it took.
  echo "== $1 ${*:2:4} ... took $((SECONDS - start)) s"
}

run ctest --test-dir build -L unit -j"$jobs" --output-on-failure --timeout 600
run ctest --test-dir build -L 'integration|python|gpu' -j1 --output-on-failure

# libFuzzer targets (clang, ASan+UBSan) on their seed corpora, a fixed number of inputs each.
run ./scripts/fuzz.sh

if [ "${SMDDP_SKIP_SANITIZERS:-0}" != "1" ]; then
  for san in address thread; do
    dir="build-$san"
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSMDDP_ONLY_CORE=ON -DSMDDP_SANITIZE="$san" >/dev/null
    start=$SECONDS
    cmake --build "$dir" -j"$jobs"
    echo "== the $san build took $((SECONDS - start)) s"
    # TSan needs the default ASLR layout; setarch -R keeps it from failing on newer kernels.
    if [ "$san" = thread ] && command -v setarch >/dev/null; then
      run setarch "$(uname -m)" -R ctest --test-dir "$dir" -L unit -j"$jobs" --output-on-failure --timeout 900
    else
      run ctest --test-dir "$dir" -L unit -j"$jobs" --output-on-failure --timeout 900
    fi
  done
fi

# ctest shows a suite whose tests all skipped as Skipped; this also shows suites that skipped some.
if compgen -G "build/Testing/skips/*.txt" >/dev/null; then
  echo "== suites that skipped tests:"
  cat build/Testing/skips/*.txt
fi

left=$(ls /dev/shm 2>/dev/null | grep '^smddp\.' || true)
if [ -n "$left" ]; then
  echo "tests left shared-memory segments behind: $left"
  status=1
fi
if [ -s "$failures" ]; then
  echo "what failed:"
  cat "$failures"
fi
echo "== scripts/test.sh took $SECONDS s in all"
if [ "$status" -eq 0 ]; then echo "scripts/test.sh: all test suites passed"; else echo "scripts/test.sh: FAILURES above"; fi
exit "$status"
