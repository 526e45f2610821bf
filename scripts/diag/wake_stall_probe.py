"""Looks for wake-up stalls between the ranks and the daemon: many small smddp all_reduces on
CPU tensors, with a gloo barrier every few ops and the ranks arriving at different times (the
daemon idles and sleeps on its doorbell meanwhile), timing each op.

    smddprun --nproc-per-node 2 -- python3 scripts/diag/wake_stall_probe.py [OPS] [EVERY] [IDLE_MS]
"""
import os, sys, time
import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401

dist.init_process_group(backend="smddp")
rank = dist.get_rank()
gloo = dist.new_group(backend="gloo")
n_ops = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
every = int(sys.argv[2]) if len(sys.argv) > 2 else 20
idle_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
t = torch.ones(1024)
worst = []
slow = 0
for i in range(n_ops):
    if i % every == 0:
        dist.barrier(group=gloo)
        time.sleep(idle_ms / 1000.0 * (1 + rank))  # ranks arrive at different times
    t0 = time.perf_counter()
    dist.all_reduce(t)
    dt = time.perf_counter() - t0
    if dt > 0.02:
        slow += 1
        worst.append((round(dt * 1000, 1), i))
worst.sort(reverse=True)
print("rank %d: %d ops, %d over 20 ms, worst %s" % (rank, n_ops, slow, worst[:5]), flush=True)
dist.destroy_process_group()
