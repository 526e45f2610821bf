#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan into build-fuzz/, and runs
# each on its seed corpus (tests/fuzz/corpus/<target>/):
#   scripts/fuzz.sh           FUZZ_RUNS inputs per target (default 20000): part of scripts/test.sh
#   scripts/fuzz.sh --long    FUZZ_SECONDS per target (default 300): part of scripts/test.sh --long
# Inputs that found new coverage go to build-fuzz/corpus/<target>/ (not the tree). A crash stops
# the run with its input saved as build-fuzz/crash-*; the fix adds that input to the seed corpus.
# Prints, per target, the inputs run and the coverage reached (for docs/testing.md's table).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
long=0
[ "${1:-}" = "--long" ] && long=1
build=build-fuzz
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ is missing (scripts/setup.sh installs it)"; exit 1
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DSMDDP_ONLY_CORE=ON -DSMDDP_BUILD_TESTS=OFF -DSMDDP_FUZZ=ON >/dev/null
targets=(request_validator config daemon_args control_request)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}"
status=0
for t in "${targets[@]}"; do
  work="$build/corpus/$t"
  mkdir -p "$work"
  if [ "$long" -eq 1 ]; then
    budget=(-max_total_time="${FUZZ_SECONDS:-300}")
  else
    budget=(-runs="${FUZZ_RUNS:-20000}")
  fi
  log="$build/$t.log"
  # New inputs go to the first folder (build-fuzz/corpus), the tree's seeds are read only.
  if (cd "$build" && "./bin/fuzz_$t" "${budget[@]}" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 "corpus/$t" "$here/tests/fuzz/corpus/$t") >"$log" 2>&1; then
    runs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')"
    cov="$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)"
    echo "fuzz $t: ok, $runs inputs, $cov"
  else
    status=1
    echo "fuzz $t: FAILED (log: $log)"
    grep -E "ERROR|SUMMARY|runtime error|==[0-9]+==|deadly|abort|Test unit written" "$log" | head -20 || tail -30 "$log"
  fi
done
exit $status
