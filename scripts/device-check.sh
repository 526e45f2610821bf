#!/usr/bin/env bash
# Builds and runs the GPU tests and benchmarks on a machine with a GPU, in one run that fits a
# 10-minute limit, and writes every log plus a JSON summary under $OUT (default ./device-out).
#
#   scripts/device-check.sh [--quick] [--all-gpus] [--no-bench] [--mpirun-training] [--skip STEPS]
#                           [--steps STEPS] [--only LABELS]
#
# --quick builds only what the GPU path needs and runs its steps, each under its own time limit
# so that one hang cannot eat the run:
#   gpu_copier       the arena copier on the GPU (lanes, fences, ordering)
#   gpu_kernels      the reduction kernel per dtype x op against a host reference
#   gpu_collectives  every collective x dtype beside NCCL, through smddprun (2 GPUs)
#   gpu_capture      collectives refused inside CUDA graph captures, captures beside them
#   gpu_training     DDP / FSDP1 / FSDP2 parity with NCCL (2 GPUs)
#   latency_probe    where a small all-reduce's time goes
#   gpu_multinode    CUDA tensors across 2 simulated nodes: staged (1 rank a node) and
#                    hierarchical (2 nodes x 2 ranks on one GPU) at small sizes
#   gpu_hier_big     the hierarchical collectives at 64 Mi elements (2 x 2 on one GPU)
#   gpu_hier_training  DDP and FSDP2 across 2 x 2 against one node of 4 (one GPU)
#   gpu_hier_failures  a rank killed before, during and after hierarchical all-reduces
#   bench_sweep, bench_overlap, overlap_floor   smddp beside NCCL on one node (2 GPUs)
#   bench_across_nodes  CUDA tensors across 2 x 2 simulated nodes: hierarchical beside staged,
#                    and the previous build's path beside them when .old-tree holds its sources
# --steps a,b runs only those steps; --skip a,b leaves them out; --fail-fast stops at the first
# failing step. Each step's line and summary.json say how many of its tests skipped (exit
# status 77: all of them). Without --quick, the ctest suites (labels: --only) and
# scripts/bench_gpu.sh run instead.
set -uo pipefail

# Tests a step's log says were skipped: the last pytest summary line's "N skipped", else
# gtest's "[  SKIPPED ] N tests"; 0 when neither says so (benchmarks, probes).
skipped_in() {
  local log="$1" line n
  line="$(grep -E '[0-9]+ (passed|failed|skipped|errors?|deselected)( |,|$)' "$log" 2>/dev/null | tail -1)"
  if [ -n "$line" ]; then
    n="$(grep -oE '[0-9]+ skipped' <<<"$line" | grep -oE '[0-9]+')"
    echo "${n:-0}"; return
  fi
  n="$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?' "$log" 2>/dev/null | grep -oE '[0-9]+' | tail -1)"
  echo "${n:-0}"
}

# summary.json: each step's exit status (77: every test of it skipped), and under "skipped"
# the steps that skipped tests, with how many.
write_summary() {  # write_summary: from step_rc and step_skipped
  local first=1 k
  echo "{"
  for k in "${!step_rc[@]}"; do
    [ $first -eq 1 ] || echo ","
    first=0
    printf '  "%s": %s' "$k" "${step_rc[$k]}"
  done
  [ $first -eq 1 ] || echo ","
  printf '  "skipped": {'
  first=1
  for k in "${!step_skipped[@]}"; do
    [ "${step_skipped[$k]}" -gt 0 ] || continue
    [ $first -eq 1 ] || printf ','
    first=0
    printf ' "%s": %s' "$k" "${step_skipped[$k]}"
  done
  echo " }"
  echo "}"
}
# Sourced (tests/scripts): the functions above only.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then return 0; fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
OUT="${OUT:-$here/device-out}"
mkdir -p "$OUT"
bench=1
quick=0
mpirun_training=0
skip=","
steps=""
fail_fast=0
failed=0
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
    --steps) steps=",$2,"; shift ;;
    # Stop after the first step that fails (a machine's time is too dear to spend on the rest).
    --fail-fast) fail_fast=1 ;;
    --only) labels="$2"; shift ;;
    *) echo "unknown option $1"; exit 2 ;;
  esac
  shift
done
jobs=$(nproc)
build="$here/build-device"
summary="$OUT/summary.json"
declare -A step_rc step_skipped

step() {  # step NAME COMMAND...: runs it with its log in $OUT/NAME.log
  local name="$1"; shift
  # configure and the builds always run: every step needs them.
  if [[ "$skip" == *",$name,"* ]] || { [ -n "$steps" ] && [[ "$steps" != *",$name,"* ]] &&
                                       [[ ",configure,build,build_old," != *",$name,"* ]]; } ||
     [ "$failed" -eq 1 ]; then
    echo "$name: skipped"; return 0
  fi
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  step_rc[$name]=$?
  step_skipped[$name]="$(skipped_in "$OUT/$name.log")"
  local note=""
  if [ "${step_rc[$name]}" -eq 77 ]; then
    note=", SKIPPED: every test skipped (${step_skipped[$name]})"
  elif [ "${step_skipped[$name]}" -gt 0 ]; then
    note=", ${step_skipped[$name]} tests SKIPPED"
  fi
  echo "$name: rc=${step_rc[$name]} ($((SECONDS - t0)) s)$note"
  if [ "${step_rc[$name]}" -ne 0 ] && [ "$fail_fast" -eq 1 ]; then failed=1; fi
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
    arena_copier_tests reduce_kernel_tests
  if [ "${step_rc[build]}" -eq 0 ]; then
    # The arena copier on the GPU (CUDA tensors across nodes): lanes, fences, ordering.
    step gpu_copier timeout 120 "$build/bin/arena_copier_tests"
    step gpu_kernels timeout 240 "$build/bin/reduce_kernel_tests"
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
    fabric="$([ -e "$build/daemon/transport/libsmddp_transport.a" ] && echo ON || echo OFF)"
    step gpu_multinode "${gpu_env[@]}" SMDDP_HAVE_FABRIC="$fabric" SMDDP_TRACE_HIER=1 timeout 200 "$py" -m pytest "${pytest_args[@]}" \
      tests/gpu/test_gpu_multinode.py -k "not 64mi and not training and not killed"
    # CUDA tensors across 2 simulated nodes x 2 ranks: hierarchical beside staged, and the
    # previous build (.old-tree: its sources, built here beside this one) on the same job shape.
    if [ "$fabric" = ON ] && [ "$bench" -eq 1 ]; then
      mkdir -p "$OUT/bench"
      # BENCH_ACROSS_SET="fabric.provider=shm daemon.chunk_kib=4096": daemon settings for it;
      # BENCH_ACROSS_ARGS="--mps": more options of bench_across_nodes.py.
      across_set=()
      for kv in ${BENCH_ACROSS_SET:-}; do across_set+=(--set "$kv"); done
      for a in ${BENCH_ACROSS_ARGS:-}; do across_set+=("$a"); done
      step bench_across_nodes timeout 180 "$py" scripts/bench_across_nodes.py --build "$build" "${across_set[@]}" \
        --ops allreduce,allgather,reducescatter --min 1M --max "${BENCH_ACROSS_MAX:-256M}" --json "$OUT/bench/across_nodes.json"
      if [ -d .old-tree ]; then
        step build_old bash -c "cmake -S .old-tree -B build-old -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
          cmake --build build-old -j$jobs --target smddp-daemon smddp-ctl smddp_torch_plugin smddprun"
        step bench_across_nodes_old timeout 120 "$py" scripts/bench_across_nodes.py --build build-old --paths staged \
          --ops allreduce,allgather,reducescatter --min 1M --max 256M --json "$OUT/bench/across_nodes_old.json"
      fi
    fi
    # About 110 s on the H200 host (656 checks); the results are compared on the GPU.
    step gpu_hier_big "${gpu_env[@]}" SMDDP_HAVE_FABRIC="$fabric" timeout 300 "$py" -m pytest "${pytest_args[@]}" \
      tests/gpu/test_gpu_multinode.py -k 64mi
    step gpu_hier_training "${gpu_env[@]}" SMDDP_HAVE_FABRIC="$fabric" timeout 180 "$py" -m pytest "${pytest_args[@]}" \
      tests/gpu/test_gpu_multinode.py -k training
    # A survivor still in its collectives 5 s after the victim's death prints its stacks.
    step gpu_hier_failures "${gpu_env[@]}" SMDDP_HAVE_FABRIC="$fabric" SMDDP_TEST_STACKS_AFTER=5 timeout 180 "$py" -m pytest "${pytest_args[@]}" \
      tests/gpu/test_gpu_multinode.py -k killed
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
    fi
  fi
elif step build cmake --build "$build" -j"$jobs"; [ "${step_rc[build]}" -eq 0 ]; then
  step tests ctest --test-dir "$build" -L "$labels" -j1 --output-on-failure --timeout 900
  if [ "$bench" -eq 1 ] && [ -x scripts/bench_gpu.sh ]; then
    step bench scripts/bench_gpu.sh --build "$build" --results "$OUT/bench"
  fi
fi
cp "$build/CMakeCache.txt" "$OUT/" 2>/dev/null || true

write_summary >"$summary"
cat "$summary"
grep -E "tests passed|tests failed" "$OUT/tests.log" 2>/dev/null || true
