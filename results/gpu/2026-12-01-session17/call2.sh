#!/bin/bash
# Session 17 call 2 (one H200 host, 16 cores; host tensors only, no GPU used): host collectives
# that only move bytes, with the ranks copying their outputs from the members' arenas
# (daemon.direct_read_min_kib: 64, the default, and 0, every size) against the daemon's own
# copies ("off", the old way), 2 and 4 ranks in one node, two rounds in alternating order; then
# Open MPI (vader, single copy off as on the CPU machine) beside at the same sizes.
set -u
bn=$PWD/build-device
cmake -S . -B $bn -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/configure.log 2>&1 || { tail -30 $OUT/configure.log; exit 1; }
cmake --build $bn -j16 --target smddp-daemon smddprun smddp-bench mpi-bench > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
run() {  # ranks bound op
  echo "== smddp $1 $2 $3"
  timeout 120 $bn/bin/smddprun --nproc-per-node $1 --config configs/local.ini --set daemon.direct_read_min_kib=$2 -- \
    $bn/bin/smddp-bench -o $3 -b 8 -e 16M -f 8 -n 200 -w 20 -c 1 2>&1 | grep -E "^ +[0-9]+ |rror"
}
order() { [ $1 = 2 ] && echo "0 64 off" || echo "off 64 0"; }
t0=$SECONDS
for r in 1 2; do for np in 2 4; do for op in allgather broadcast gather scatter alltoall; do
  for v in $(order $r); do run $np $v $op; done; done; done; done > $OUT/direct.log 2>&1
echo "smddp runs: $((SECONDS - t0)) s"
for np in 2 4; do for op in allgather broadcast gather scatter alltoall; do
  echo "== mpi $np $op"
  timeout 120 mpirun -np $np --mca btl self,vader --mca btl_vader_single_copy_mechanism none --bind-to none \
    --allow-run-as-root $bn/bin/mpi-bench -o $op -b 8 -e 16M -f 8 -n 200 -w 20 -c 1 2>&1 | grep -E "^ +[0-9]+ |rror"
done; done > $OUT/mpi.log 2>&1
echo "all runs: $((SECONDS - t0)) s"; grep -c "^==" $OUT/direct.log $OUT/mpi.log; grep -i rror $OUT/direct.log $OUT/mpi.log | head
