"""Training parity on the GPU path: a small transformer trained for 30 steps with DDP (fp32
and bf16 autocast), FSDP1 FULL_SHARD and FSDP2 fully_shard, once over an smddp group and once
over an NCCL group of the same job, from the same seed and data. The per-step losses (and
FSDP2's full_tensor() parameters) must agree (fp32: rtol 1e-5). FSDP1 and FSDP2 run a second
time over an smddp group made with SMDATAPARALLEL_OPTIMIZE_SDP=true, as SMDDP's users of
sharded data parallelism set it: their AllGathers then take the copy-engine path (and, when
small, its CUDA graphs, whose buffers FSDP allocates anew).

Ranks that share one GPU (SMDDP_TEST_NO_NCCL=1, which NCCL refuses; SMDDP_TEST_GPU_BY_RANK=1 picks
GPU RANK modulo the GPUs) train DDP and FSDP2 over smddp only, and rank 0 writes the per-step
losses and FSDP2's parameter sums to SMDDP_TEST_LOSSES (JSON): the test compares two jobs, e.g.
one across simulated nodes against one on a single node."""

import faulthandler
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from common import Checker, init
from tiny_transformer import VOCAB, Model

# A run cut by its time limit says where every rank was (SMDDP_TEST_STACKS_AFTER seconds).
if os.environ.get("SMDDP_TEST_STACKS_AFTER"):
    faulthandler.dump_traceback_later(float(os.environ["SMDDP_TEST_STACKS_AFTER"]), exit=False)
T0 = time.time()
# Imported first: it maps the launcher's variables (mpirun's OMPI_COMM_WORLD_LOCAL_RANK) to
# LOCAL_RANK, which picks this rank's GPU.
import smdistributed.dataparallel.torch.torch_smddp  # noqa: E402,F401

local = int(os.environ.get("LOCAL_RANK", "0"))
if os.environ.get("SMDDP_TEST_GPU_BY_RANK") == "1":
    local = int(os.environ["RANK"]) % torch.cuda.device_count()
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
rank, W = init()
NO_NCCL = os.environ.get("SMDDP_TEST_NO_NCCL") == "1"
nccl = None if NO_NCCL else dist.new_group(backend="nccl")
smddp = dist.new_group(backend="smddp")
os.environ["SMDATAPARALLEL_OPTIMIZE_SDP"] = "true"  # read when a group is made
smddp_sdp = dist.new_group(backend="smddp")
os.environ.pop("SMDATAPARALLEL_OPTIMIZE_SDP")
chk = Checker(rank)
STEPS = 30


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randint(0, VOCAB, (8, 16), generator=g)
    return x.to(dev), torch.roll(x, 1, 1).to(dev)


# FSDP2's meshes, by group. Meshes over the same ranks compare (and hash) equal unless their
# dimension names differ, and DTensor's caches then hand one run's mesh, and so its process
# group, to the next run's full_tensor(): with one name for every group, the NCCL run's
# full_tensor() went through smddp (and the SDP run's through the kernel group).
def mesh_name(group):
    return "nccl" if group is nccl else ("smddp_sdp" if group is smddp_sdp else "smddp")


def train(kind, group):
    torch.manual_seed(0)
    model = Model().to(dev)
    if kind in ("ddp", "ddp_bf16"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        m = DDP(model, device_ids=[local], process_group=group)
    elif kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        m = FSDP(model, process_group=group, sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=local)
    elif kind == "fsdp2":
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        mesh = DeviceMesh.from_group(group, "cuda", mesh_dim_names=(mesh_name(group),))
        for layer in model.enc.layers:
            fully_shard(layer, mesh=mesh)
        m = fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=kind == "ddp_bf16"):
            out = m(x)
        loss = nn.functional.cross_entropy(out.float().reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    params = None
    if kind == "fsdp2":
        params = torch.cat([p.full_tensor().flatten() for p in m.parameters()]).cpu()
    return losses, params


def parity(kind, group):
    a, pa = train(kind, group)
    if rank == 0:
        print("%s: smddp done at %.1f s" % (kind, time.time() - T0), flush=True)
    b, pb = train(kind, nccl)
    ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    if not torch.allclose(ta, tb, rtol=1e-5, atol=0):
        i = int((ta - tb).abs().argmax())
        return "losses differ at step %d: smddp %r nccl %r (first: %r vs %r)" % (i, a[i], b[i], a[0], b[0])
    if pa is not None and not torch.allclose(pa, pb, rtol=1e-5, atol=1e-7):
        return "full_tensor() parameters differ: max %g" % (pa - pb).abs().max().item()
    if rank == 0:
        print("losses %s: smddp %.6f -> %.6f, nccl %.6f -> %.6f" % (kind, a[0], a[-1], b[0], b[-1]), flush=True)
    return None


def allgather_work():
    """(AllGathers, kernel launches for them) this rank's GPU ran so far through smddp."""
    from smdistributed.dataparallel.torch import _smddp_c
    a = (_smddp_c.gpu_work() or {}).get("allgather", {})
    return a.get("ops", 0), a.get("kernels", 0)


def sdp_parity(kind):
    ops0, kernels0 = allgather_work()
    err = parity(kind, smddp_sdp)
    if err:
        return err
    ops1, kernels1 = allgather_work()
    if ops1 == ops0:
        return "no AllGather ran on this rank's GPU through the SDP group"
    if kernels1 != kernels0:
        return "%d kernel launches for %d AllGathers with SMDATAPARALLEL_OPTIMIZE_SDP (copy engines only)" % (
            kernels1 - kernels0, ops1 - ops0)
    if rank == 0:
        print("%s over the SDP group: %d AllGathers, no kernel" % (kind, ops1 - ops0), flush=True)
    return None


def record(name, kind, group, out):
    """Without NCCL: trains over `group` and keeps the losses (and parameter sums) for the test."""
    losses, params = train(kind, group)
    out[name] = {"losses": losses, "params": None if params is None else float(params.double().sum())}
    return None


if NO_NCCL:
    runs = {}
    for name, kind, group in (("ddp", "ddp", smddp), ("fsdp2", "fsdp2", smddp), ("fsdp2_sdp", "fsdp2", smddp_sdp)):
        chk.run("training.%s" % name, record, name, kind, group, runs)
    if rank == 0 and os.environ.get("SMDDP_TEST_LOSSES"):
        import json
        with open(os.environ["SMDDP_TEST_LOSSES"], "w") as f:
            json.dump(runs, f)
else:
    for kind in ("ddp", "ddp_bf16", "fsdp1", "fsdp2"):
        chk.run("training.%s" % kind, parity, kind, smddp)
    for kind in ("fsdp1", "fsdp2"):
        chk.run("training.%s_sdp" % kind, sdp_parity, kind)
torch.cuda.synchronize()
dist.barrier()
rc = chk.finish()
dist.destroy_process_group()
sys.exit(rc)
