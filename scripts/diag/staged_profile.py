"""Where a small synchronous all_reduce of a CUDA tensor across 2 simulated nodes spends its time.
Rank 0 on CUDA, rank 1 on host tensors. Times 1000 ops, then profiles 40 with torch.profiler
(CPU + CUDA activity, every thread of the process) and writes the chrome trace to
$OUT/trace_SIZE.json.

    OUT=/tmp SIZE=8 PYTHONPATH=build/python build/bin/smddprun --simulate-nodes 2 --nproc-per-node 1 -- \
        python3 scripts/diag/staged_profile.py
"""
import os, sys, time, json
import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
from torch.profiler import ProfilerActivity, profile, record_function

rank = int(os.environ["RANK"])
torch.cuda.set_device(0)
dist.init_process_group("smddp")
size = int(os.environ.get("SIZE", "8"))
dev = "cuda" if rank == 0 else "cpu"
t = torch.ones(max(1, size // 4), device=dev)
h = torch.ones(max(1, size // 4))
def timed(x, n):
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize(); dist.barrier()
    t0 = time.monotonic_ns()
    for _ in range(n):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    return (time.monotonic_ns() - t0) / n / 1e3
for rnd in range(3):
    a = timed(t, 1000); b = timed(h, 1000)
    if rank == 0: print("round %d size %d: cuda-rank %.1f us/op, host %.1f us/op" % (rnd, size, a, b), flush=True)
# One op at a time, each synchronized, then profiled.
def one(i):
    with record_function("op%d" % i):
        dist.all_reduce(t)
    with record_function("sync%d" % i):
        torch.cuda.synchronize()
for i in range(20): one(i)
dist.barrier()
if rank == 0:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(40): one(i)
        dist.barrier()
    prof.export_chrome_trace(os.path.join(os.environ["OUT"], "trace_%d.json" % size))
else:
    for i in range(40): one(i)
    dist.barrier()
dist.destroy_process_group()
