#!/usr/bin/env python3
"""A small MLP trained with DistributedDataParallel on the smddp backend, on CPU or GPU.

    smddprun --nproc-per-node 2 -- python examples/train_ddp.py --steps 20
    smddprun --nproc-per-node 2 -- python examples/train_ddp.py --device cuda
    mpirun -np 2 python examples/train_ddp.py         # the plugin starts the daemon itself
    torchrun --nproc-per-node 2 examples/train_ddp.py

Each rank trains on its shard of a fixed synthetic regression set; the loss printed by rank 0
is the global mean (an all_reduce with AVG).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  registers backend "smddp"


def find_smddp_ctl():
    """smddp-ctl on PATH, else beside the smddp-daemon of the build this package came from."""
    import shutil
    found = shutil.which("smddp-ctl")
    if found:
        return found
    from smdistributed.dataparallel.torch import _launch
    for bin_dir in _launch._build_bin_dirs():
        path = os.path.join(bin_dir, "smddp-ctl")
        if os.access(path, os.X_OK):
            return path
    return None


def show_status():
    # The operator's view of the daemon serving this job (SMDDP_JOB_ID is set under both
    # launch paths once init_process_group has run), while it still runs.
    import subprocess
    ctl = find_smddp_ctl()
    if ctl is None:
        print("--show-status: smddp-ctl not found (put the smddp build's bin/ on PATH)", flush=True)
        return
    job = ["--job", os.environ["SMDDP_JOB_ID"]] if "SMDDP_JOB_ID" in os.environ else []
    subprocess.run([ctl, "status", *job], check=False)
    health = subprocess.run([ctl, "health", *job], check=False)
    print("smddp-ctl health exit status: %d (0 healthy, 1 degraded, 2 unreachable)" % health.returncode, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--show-status", action="store_true",
                        help="rank 0 prints 'smddp-ctl status' and 'smddp-ctl health' before exiting")
    args = parser.parse_args()

    dist.init_process_group(backend="smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))))

    torch.manual_seed(0)  # the same data and initial model on every rank
    n = args.batch * world
    x = torch.randn(n, 16)
    y = x @ torch.randn(16, 1) + 0.1 * torch.randn(n, 1)
    x, y = x[rank * args.batch:(rank + 1) * args.batch].to(device), y[rank * args.batch:(rank + 1) * args.batch].to(device)

    model = nn.Sequential(nn.Linear(16, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    for step in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)
        if rank == 0:
            print("step %3d  loss %.6f" % (step, global_loss.item()), flush=True)

    # DDP averages the gradients, so every rank takes the same steps: the models agree. Each
    # rank prints a checksum of its parameters (one write, so lines of ranks do not mix).
    checksum = sum(float((p.detach().double().flatten() * torch.arange(1, p.numel() + 1, dtype=torch.float64,
                                                                         device=p.device)).sum())
                   for p in model.parameters())
    os.write(1, ("rank %d parameter checksum %.17g\n" % (rank, checksum)).encode())
    dist.barrier()
    if rank == 0:
        print("done: %d ranks on %s, backend %s" % (world, device, dist.get_backend()), flush=True)
        if args.show_status:
            # The operator's view of the daemon serving this job, while it still runs.
            show_status()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
