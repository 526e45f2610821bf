"""Uneven all_to_all_single (MoE-style split lists) on CUDA tensors: smddp beside NCCL.

Each rank sends a quarter of its rows to the lower rank number and three quarters to the
higher (with 2 ranks: rank 0 keeps 1/4 and sends 3/4, rank 1 sends 1/4 and keeps 3/4), for
several total sizes, and prints the time per call (20 back to back, after 3 untimed) of each
backend. Set SMDDP_GPU_EXEC=daemon to time the daemon-side form.

    smddprun --nproc-per-node 2 -- python3 scripts/diag/alltoallv_probe.py
"""
import os
import time

import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  registers "smddp"

local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dist.init_process_group("smddp")
rank, world = dist.get_rank(), dist.get_world_size()
nccl = dist.new_group(backend="nccl")


def splits_of(r, rows):
    # Rows rank r sends to each rank: weights 1, 3, 1, 3, ... normalized.
    w = [1 + 2 * (q % 2) for q in range(world)]
    s = [rows * x // sum(w) for x in w]
    s[-1] += rows - sum(s)
    return s


for mib in (1, 16, 128):
    rows = (mib << 20) // 4 // 256  # float32 rows of 256
    send = splits_of(rank, rows)
    recv = [splits_of(q, rows)[rank] for q in range(world)]
    inp = torch.randn(rows, 256, device="cuda")
    out = torch.empty(sum(recv), 256, device="cuda")
    ref = torch.empty_like(out)
    res = {}
    for name, group in (("smddp", None), ("nccl", nccl)):
        for _ in range(3):
            dist.all_to_all_single(out if group is None else ref, inp, recv, send, group=group)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            dist.all_to_all_single(out if group is None else ref, inp, recv, send, group=group)
        torch.cuda.synchronize()
        res[name] = (time.perf_counter() - t0) / 20 * 1e6
    same = bool(torch.equal(out, ref))
    if rank == 0:
        print("PROBE alltoallv %4d MiB per rank: smddp %9.1f us  nccl %9.1f us  nccl/smddp %.2f  equal %s"
              % (mib, res["smddp"], res["nccl"], res["nccl"] / res["smddp"], same), flush=True)
dist.destroy_process_group()
