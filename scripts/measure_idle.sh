#!/usr/bin/env bash
# Measures the CPU an idle daemon uses: a job of 2 ranks that attach and then sleep; the
# daemon's user+system time over the sleep is read from /proc/<pid>/stat.
#   scripts/measure_idle.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$here/build}"
secs="${2:-20}"
job="idle-$$"
export SMDDP_SOCKET_DIR="${SMDDP_SOCKET_DIR:-$(mktemp -d)}"
"$build/bin/smddprun" --job-id "$job" --nproc-per-node 2 --config "$here/configs/local.ini" -- \
  "$build/bin/failure_worker" --mode idle --seconds "$((secs + 4))" >/dev/null 2>&1 &
launcher=$!
pid=""
for _ in $(seq 100); do
  pid=$(pgrep -f "smddp-daemon --job-id $job" | head -1 || true)
  [ -n "$pid" ] && break
  sleep 0.1
done
[ -n "$pid" ] || { echo "daemon did not start"; exit 1; }
sleep 2  # let the ranks attach and settle
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
t0=$(ticks "$pid"); sleep "$secs"; t1=$(ticks "$pid")
hz=$(getconf CLK_TCK)
wait "$launcher" || true
awk -v d="$((t1 - t0))" -v hz="$hz" -v s="$secs" \
  'BEGIN { printf "idle daemon: %.3f s of CPU in %d s = %.2f%% of one core\n", d / hz, s, 100 * d / hz / s }'
