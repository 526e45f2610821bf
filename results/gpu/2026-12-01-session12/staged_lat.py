"""Diag (session 12): synchronous all_reduce of CUDA tensors across 2 simulated nodes, per size,
with phase boundaries (CLOCK_MONOTONIC ns) written for the staging trace."""
import os
import sys
import time

import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401

rank = int(os.environ["RANK"])
torch.cuda.set_device(rank % torch.cuda.device_count())
dist.init_process_group("smddp")
out = os.environ["SMDDP_DIAG_TRACE_DIR"]
iters = int(os.environ.get("ITERS", "300"))
ops = os.environ.get("OPS", "allreduce").split(",")
phases = []
for op in ops:
    for size in [int(x) for x in os.environ.get("SIZES", "8,32768,131072,1048576").split(",")]:
        for dev in ("cuda", "cpu"):
            n = max(1, size // 4)
            # MIXED=1: only rank 0 uses CUDA tensors (one context on the GPU: no time-slicing
            # between the ranks' contexts); the others stay on host tensors.
            mine = "cpu" if os.environ.get("MIXED") == "1" and rank != 0 else dev
            t = torch.ones(n, device=mine)
            o = torch.empty(2 * n, device=mine)
            if op == "allreduce":
                fn = lambda: dist.all_reduce(t)  # noqa: E731
            else:
                fn = lambda: dist.all_gather_into_tensor(o, t)  # noqa: E731
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.monotonic_ns()
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
            t1 = time.monotonic_ns()
            phases.append((op, size, dev, t0, t1))
            if rank == 0:
                print("%s %8d %s %8.1f us/op" % (op, size, dev, (t1 - t0) / iters / 1e3), flush=True)
with open(os.path.join(out, "phases.%d.txt" % os.getpid()), "w") as f:
    for p in phases:
        f.write("%s %d %s %d %d\n" % p)
dist.destroy_process_group()
