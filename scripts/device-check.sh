#!/usr/bin/env bash
# One call on the GPU machine (through the device tool): builds with that machine's
# toolchain and torch, runs the unit, integration and Python suites (GPU tests included;
# they skip on a CPU machine), then the benchmarks when asked, and writes every log plus a
# JSON summary under $OUT (default ./device-out).
#
#   scripts/device-check.sh [--quick] [--all-gpus] [--no-bench] [--mpirun-training] [--skip STEPS]
#                           [--only LABELS]
#
# --quick builds only what the GPU path needs, runs the GPU suites through smddprun only (and
# across 2 simulated nodes; steps gpu_copier, gpu_collectives, gpu_capture, gpu_training,
# latency_probe, gpu_multinode), then the benchmark sweep (16 B to 1 GiB beside NCCL), the overlap
# benchmark and CUDA tensors across 2 simulated nodes, each step under its own time limit so that
# one hang cannot eat the call. On 2xH200 it takes 8-10 minutes (the collectives suite alone
# 4-6, more on a slow host): to stay inside a 10-minute limit, split it, e.g. `--no-bench
# --mpirun-training` in one run and `--skip gpu_collectives,gpu_capture,gpu_training,gpu_multinode`
# in the next.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
OUT="${OUT:-$here/device-out}"
mkdir -p "$OUT"
bench=1
quick=0
mpirun_training=0
skip=","
labels='unit|integration|python|gpu'
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    # GPU suites on every GPU of the machine (up to 8) instead of 2 (issue 6: 4 or 8 GPUs).
    --all-gpus) export SMDDP_TEST_NPROC="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" ;;
    --no-bench) bench=0 ;;
    --mpirun-training) mpirun_training=1 ;;
    # Steps of --quick to leave out, by name (comma-separated: gpu_training,gpu_multinode,...).
    --skip) skip=",$2,"; shift ;;
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
  if [[ "$skip" == *",$name,"* ]]; then echo "$name: skipped"; return 0; fi
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  step_rc[$name]=$?
  echo "$name: rc=${step_rc[$name]} ($((SECONDS - t0)) s)"
  # A step cut by its time limit may leave its job behind (by exact process name only).
  pkill -9 -x smddp-daemon 2>/dev/null || true
}

{
  echo "date: $(date -u +%FT%TZ)"; uname -a; nvidia-smi -L 2>&1; nvidia-smi topo -m 2>&1 | head -8
  g++ --version | head -1; cmake --version | head -1; command -v nvcc && nvcc --version | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1
  mpirun --version 2>&1 | head -1
} >"$OUT/env.log" 2>&1

step configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ "$quick" -eq 1 ]; then
  step build cmake --build "$build" -j"$jobs" --target smddp-daemon smddp-ctl smddp_torch_plugin smddprun \
    arena_copier_tests
  if [ "${step_rc[build]}" -eq 0 ]; then
    # The arena copier on the GPU (CUDA tensors across nodes): lanes, fences, ordering.
    step gpu_copier timeout 120 "$build/bin/arena_copier_tests"
    py="$(command -v python3)"
    gpu_env=(env SMDDP_BUILD_DIR="$build" SMDDP_TEST_PYTHON="$py" PYTHONPATH="$build/python")
    pytest_args=(-x -q -rs -p no:cacheprovider)
    step gpu_collectives "${gpu_env[@]}" timeout 420 "$py" -m pytest "${pytest_args[@]}" \
      tests/gpu/test_gpu_collectives.py -k "smddprun or expandable or disagreement or forms or daemon_exec"
    step gpu_capture "${gpu_env[@]}" timeout 240 "$py" -m pytest "${pytest_args[@]}" tests/gpu/test_gpu_capture.py
    step gpu_training "${gpu_env[@]}" timeout 240 "$py" -m pytest "${pytest_args[@]}" \
      tests/gpu/test_gpu_training.py -k "smddprun or torchrun"
    # Where a small all-reduce's time goes (CPU issue and wait, GPU drain), from rank 0.
    step latency_probe env PYTHONPATH="$build/python" SMDDP_BIN_DIR="$build/bin" timeout 90 \
      "$build/bin/smddprun" --daemon "$build/bin/smddp-daemon" --nproc-per-node 2 -- "$py" tests/gpu/latency_probe.py
    step gpu_multinode "${gpu_env[@]}" SMDDP_HAVE_FABRIC="$([ -e "$build/daemon/transport/libsmddp_transport.a" ] && echo ON || echo OFF)" \
      timeout 120 "$py" -m pytest "${pytest_args[@]}" tests/gpu/test_gpu_multinode.py
    if [ "$mpirun_training" -eq 1 ]; then
      # Plain mpirun (the plugin starts the daemon); the ranks print their stacks if it is slow.
      step gpu_training_mpirun "${gpu_env[@]}" SMDDP_TEST_STACKS_AFTER=150 timeout 200 "$py" -m pytest \
        "${pytest_args[@]}" tests/gpu/test_gpu_training.py -k mpirun
    fi
    if [ "$bench" -eq 1 ]; then
      mkdir -p "$OUT/bench"
      step bench_sweep timeout 200 "$py" scripts/bench_torch.py --build "$build" --min 8 --max 1G --factor 2 \
        --json "$OUT/bench/sweep.json"
      step bench_overlap timeout 90 "$py" scripts/bench_torch.py --build "$build" --ops allgather --min 64M \
        --max 1G --overlap --json "$OUT/bench/overlap.json"
      # The same matmul loop beside raw copy-engine copies of the same bytes: the floor under it.
      step overlap_floor timeout 90 "$py" scripts/diag/overlap_floor.py
      # CUDA tensors across 2 simulated nodes (arena staging through the fabric) beside CPU tensors.
      if [ -e "$build/daemon/transport/libsmddp_transport.a" ]; then
        step bench_multinode timeout 120 "$py" scripts/bench_torch.py --build "$build" --simulate-nodes 2 --nproc 2 \
          --ops allreduce,allgather,reducescatter --min 64K --max 256M --json "$OUT/bench/multinode.json"
      fi
    fi
  fi
elif step build cmake --build "$build" -j"$jobs"; [ "${step_rc[build]}" -eq 0 ]; then
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
