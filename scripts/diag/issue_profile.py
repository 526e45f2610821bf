"""Where a small collective's CPU issue time goes, smddp beside NCCL (run under smddprun with 2
ranks): times N synchronous issues of an 8-float all_reduce and all_gather per backend, then
profiles them (torch.profiler, CPU activity: the CUDA runtime and driver calls each makes) and
prints, from rank 0, per backend the calls per op and their CPU time.

  smddprun --nproc-per-node 2 -- python3 scripts/diag/issue_profile.py [N]
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
from torch.profiler import ProfilerActivity, profile

n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dist.init_process_group("smddp")
rank = dist.get_rank()
groups = {"smddp": None, "nccl": dist.new_group(backend="nccl"),
          "smddp_sdp": None}
os.environ["SMDATAPARALLEL_OPTIMIZE_SDP"] = "true"
groups["smddp_sdp"] = dist.new_group(backend="smddp")
del os.environ["SMDATAPARALLEL_OPTIMIZE_SDP"]
t = torch.ones(8, device="cuda")
g_out = torch.empty(16, device="cuda")


def loop(g, op, k):
    for _ in range(k):
        if op == "allreduce":
            dist.all_reduce(t, group=g)
        else:
            dist.all_gather_into_tensor(g_out, t, group=g)


for name, g in groups.items():
    for op in ("allreduce", "allgather"):
        if name == "smddp_sdp" and op == "allreduce":
            continue
        loop(g, op, 50)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        loop(g, op, n)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            loop(g, op, n)
            torch.cuda.synchronize()
        dist.barrier()
        if rank == 0:
            print("== %s %s: issue %.1f us/op, total %.1f us/op" % (name, op, (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6))
            rows = []
            for e in prof.key_averages():
                if e.count >= n // 2 and e.device_type.name == "CPU":
                    rows.append((e.self_cpu_time_total / n, e.count / n, e.key))
            for self_us, per_op, key in sorted(rows, reverse=True)[:14]:
                print("   %7.2f us self/op  %5.2f calls/op  %s" % (self_us, per_op, key[:90]))
            sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
