#!/usr/bin/env bash
# CPU collectives, side by side: smddp-bench (through smddprun and the daemon), mpi-bench
# (Open MPI over shared memory) and gloo_bench.py (torch.distributed gloo), same ranks, same
# sizes, same nccl-tests-style measurement. Raw reports go to RESULTS/raw/, the comparison is
# printed and written as markdown to RESULTS/bench_cpu.md. RESULTS defaults to
# results/<today>-cpu-bench/ (one folder per measurement; add a README.md with the commit and
# hardware before committing it).
#
#   scripts/bench_cpu.sh                          # 2 ranks, allreduce+allgather, 8 B..64 MiB
#   scripts/bench_cpu.sh --ops allreduce --min 1K --max 16M --factor 4 --ranks 2
#   scripts/bench_cpu.sh --nodes 2 --ranks 2      # across 2 simulated nodes (bench_multinode.sh)
#   scripts/bench_cpu.sh --hosts 2 --ranks 2      # across 2 namespace hosts (root; scripts/hosts.sh)
# With --nodes K the ranks are split over K simulated nodes: smddp through smddprun
# --simulate-nodes K (daemons talk over libfabric), Open MPI with TCP only (--mca btl tcp,self),
# gloo over TCP as always. With --hosts K they are split over K hosts made of Linux namespaces
# (scripts/hosts.sh, torn down afterwards), joined by veth pairs: every tool starts on the first
# host and reaches the others through mpirun's remote-shell agent, over each host's eth0.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

build="$here/build"
results="$here/results/$(date -u +%F)-cpu-bench"
ranks=2
ops="allreduce,allgather"
min=8
max=64M
factor=2
iters=20
warmup=5
check=1
dtype=float32
tools="smddp,mpi,gloo"
smddprun_args=""
nodes=1
hosts=0
md=""
gloo_python=/usr/bin/python3

usage() {
  cat <<EOF
usage: $0 [options]
  --build DIR          build tree with bin/smddprun, bin/smddp-bench, bin/mpi-bench ($build)
  --results DIR        where raw reports and bench_cpu.md go ($results)
  --ranks N            ranks for every tool ($ranks)
  --ops LIST           comma-separated: allreduce,allgather,reducescatter,broadcast,alltoall ($ops)
  --min SIZE --max SIZE --factor F    sweep, sizes with K/M/G suffixes ($min..$max x$factor)
  --iters N --warmup N --check 0|1 --dtype T     passed to every benchmark ($iters, $warmup, $check, $dtype)
  --tools LIST         which of smddp,mpi,gloo to run ($tools)
  --smddprun-args STR  extra smddprun options (e.g. "--config configs/local.ini")
  --nodes K            split the ranks over K simulated nodes (see above) ($nodes)
  --hosts K            split the ranks over K namespace hosts (see above; needs root)
  --md FILE            the markdown report's name in RESULTS (bench_cpu.md)
Binaries can also be named by SMDDPRUN, SMDDP_BENCH and MPI_BENCH.
EOF
}

while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --results) results="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --ops) ops="$2"; shift 2 ;;
    --min) min="$2"; shift 2 ;;
    --max) max="$2"; shift 2 ;;
    --factor) factor="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --check) check="$2"; shift 2 ;;
    --dtype) dtype="$2"; shift 2 ;;
    --tools) tools="$2"; shift 2 ;;
    --smddprun-args) smddprun_args="$2"; shift 2 ;;
    --nodes) nodes="$2"; shift 2 ;;
    --hosts) hosts="$2"; shift 2 ;;
    --md) md="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench_cpu.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

smddprun="${SMDDPRUN:-$build/bin/smddprun}"
smddp_bench="${SMDDP_BENCH:-$build/bin/smddp-bench}"
mpi_bench="${MPI_BENCH:-$build/bin/mpi-bench}"
gloo_bench="$here/tests/bench/gloo_bench.py"
compare="$here/tests/bench/compare_bench.py"

# shellcheck disable=SC2054  # "self,vader" is one MCA value
mpirun_args=(-np "$ranks" --mca btl self,vader --mca btl_vader_single_copy_mechanism none --bind-to none)
smddp_layout=(--nproc-per-node "$ranks")
if [ "$nodes" -gt 1 ]; then
  if [ $((ranks % nodes)) -ne 0 ]; then echo "bench_cpu.sh: --ranks $ranks is not a multiple of --nodes $nodes" >&2; exit 2; fi
  # Between nodes Open MPI would use TCP: keep it off shared memory.
  mpirun_args=(-np "$ranks" --mca btl tcp,self --mca btl_tcp_if_include lo --bind-to none)
  smddp_layout=(--simulate-nodes "$nodes" --nproc-per-node $((ranks / nodes)))
fi
on_host=()  # the prefix that runs a command on the first host (--hosts)
if [ "$hosts" -gt 0 ]; then
  if [ "$nodes" -gt 1 ]; then echo "bench_cpu.sh: --hosts and --nodes exclude each other" >&2; exit 2; fi
  if [ $((ranks % hosts)) -ne 0 ]; then echo "bench_cpu.sh: --ranks $ranks is not a multiple of --hosts $hosts" >&2; exit 2; fi
  bed="$here/scripts/hosts.sh"
  "$bed" up "$hosts" >/dev/null || exit 1
  trap '"$bed" down' EXIT
  names=$("$bed" list | cut -d' ' -f1 | paste -sd,)
  per=$((ranks / hosts))
  on_host=(env -u XDG_RUNTIME_DIR -u SMDDP_SOCKET_DIR OMPI_MCA_plm_rsh_agent="$bed agent" MASTER_ADDR="${names%%,*}"
           "$bed" exec "${names%%,*}")
  # shellcheck disable=SC2054  # "tcp,self" is one MCA value
  mpirun_args=(-np "$ranks" -H "$(echo "$names" | sed "s/\(,\|$\)/:$per\1/g")" --mca btl tcp,self
               --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 --bind-to none)
  smddp_layout=(-H "$names" --nproc-per-node "$per")
  nodes=$hosts
fi
md="${md:-bench_cpu.md}"
[ "$(id -u)" -eq 0 ] && mpirun_args+=(--allow-run-as-root)
# More ranks than cores is fine for a benchmark of this machine; say so rather than fail.
[ "$ranks" -gt "$(nproc)" ] && mpirun_args+=(--oversubscribe)
bench_args=(-b "$min" -e "$max" -f "$factor" -n "$iters" -w "$warmup" -c "$check" -d "$dtype")

mkdir -p "$results/raw"
status=0
specs=()

# run TOOL OP CMD...: runs one benchmark, its report (stdout and stderr) into raw/TOOL_OP.txt.
run() {
  local tool="$1" op="$2"; shift 2
  local out="$results/raw/${tool}_${op}.txt"
  echo "bench_cpu.sh: $tool $op: $*" >&2
  local rc
  { echo "# command: $*"; "$@" 2>&1; } >"$out"
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "bench_cpu.sh: $tool $op exited with status $rc (see $out)" >&2
    status=1
  fi
}

have_tool() { [[ ",$tools," == *",$1,"* ]]; }

for op in ${ops//,/ }; do
  spec="$op:"
  if have_tool smddp; then
    if [ -x "$smddprun" ] && [ -x "$smddp_bench" ]; then
      # shellcheck disable=SC2086  # smddprun_args is a list of options on purpose
      run smddp "$op" "${on_host[@]}" "$smddprun" "${smddp_layout[@]}" $smddprun_args -- "$smddp_bench" -o "$op" "${bench_args[@]}"
      spec+="smddp=$results/raw/smddp_$op.txt,"
    else
      echo "bench_cpu.sh: no $smddprun or $smddp_bench: smddp left out (build them first)" >&2
      status=1
    fi
  fi
  if have_tool mpi; then
    if [ -x "$mpi_bench" ]; then
      run mpi "$op" "${on_host[@]}" mpirun "${mpirun_args[@]}" "$mpi_bench" -o "$op" "${bench_args[@]}"
      spec+="mpi=$results/raw/mpi_$op.txt,"
    else
      echo "bench_cpu.sh: no $mpi_bench: MPI left out (cmake --build ... --target mpi-bench)" >&2
      status=1
    fi
  fi
  if have_tool gloo; then
    if [ "$hosts" -gt 0 ]; then
      run gloo "$op" "${on_host[@]}" mpirun "${mpirun_args[@]}" -x MASTER_ADDR -x MASTER_PORT=29531 -x GLOO_SOCKET_IFNAME=eth0 \
        "$gloo_python" "$gloo_bench" -o "$op" "${bench_args[@]}"
    else
      run gloo "$op" "$gloo_python" "$gloo_bench" --nproc "$ranks" -o "$op" "${bench_args[@]}"
    fi
    spec+="gloo=$results/raw/gloo_$op.txt,"
  fi
  specs+=("$spec")
done

note1="$(date -u +%Y-%m-%d) on $(nproc) CPU core(s) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $ranks ranks on $nodes node(s)$([ "$hosts" -gt 0 ] && echo " (namespace hosts over veth)"), $dtype, host buffers."
note2="Sizes $min..$max x$factor, $warmup warmup + $iters timed iterations per size, check $check. Raw reports in raw/."
python3 "$compare" --md "$results/$md" --note "$note1" --note "$note2" "${specs[@]}" || status=1
echo "bench_cpu.sh: markdown in $results/$md" >&2
exit "$status"
