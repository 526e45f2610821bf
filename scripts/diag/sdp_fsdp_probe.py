"""Which of FSDP2's steps launch kernels for AllGather over a group made with
SMDATAPARALLEL_OPTIMIZE_SDP=true (run under smddprun with 2 ranks on the GPU machine):

    smddprun --nproc-per-node 2 -- python3 scripts/diag/sdp_fsdp_probe.py

Rank 0 prints this rank's AllGather operations and kernel launches (the plugin's gpu_work())
after each step; each rank prints which group its torch.distributed all_gather calls named
(DTensor's, through functional collectives, do not pass there)."""
import os
import sys

import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
from smdistributed.dataparallel.torch import _smddp_c

# The training parity test's model.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python", "workers"))
from tiny_transformer import VOCAB, Model  # noqa: E402

local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("smddp")
rank = dist.get_rank()
os.environ["SMDATAPARALLEL_OPTIMIZE_SDP"] = "true"
sdp = dist.new_group(backend="smddp")
os.environ.pop("SMDATAPARALLEL_OPTIMIZE_SDP")

last = [0, 0]


def mark(what):
    a = (_smddp_c.gpu_work() or {}).get("allgather", {})
    ops, kernels = a.get("ops", 0), a.get("kernels", 0)
    if rank == 0:
        print("PROBE %-28s allgathers %4d (+%3d)  kernels %4d (+%3d)" % (what, ops, ops - last[0], kernels,
                                                                         kernels - last[1]), flush=True)
    last[:] = [ops, kernels]


# Which group and which c10d entry each AllGather used.
seen = {}
for name in ("all_gather_into_tensor", "all_gather", "_all_gather_base", "all_gather_object"):
    fn = getattr(dist, name, None)
    if fn is None:
        continue

    def wrap(fn=fn, name=name):
        def inner(*args, **kwargs):
            g = kwargs.get("group")
            key = (name, "sdp" if g is sdp else ("default" if g is None else str(g)))
            seen[key] = seen.get(key, 0) + 1
            return fn(*args, **kwargs)
        return inner
    setattr(dist, name, wrap())

mark("start")
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

torch.manual_seed(0)
model = Model().to(dev)
mesh = DeviceMesh.from_group(sdp, "cuda")
mark("mesh")
for layer in model.enc.layers:
    fully_shard(layer, mesh=mesh)
m = fully_shard(model, mesh=mesh)
mark("fully_shard")
opt = torch.optim.Adam(m.parameters(), lr=1e-3)
x = torch.randint(0, VOCAB, (8, 16), device=dev)
for step in range(3):
    out = m(x)
    mark("step %d forward" % step)
    loss = out.float().sum()
    loss.backward()
    mark("step %d backward" % step)
    opt.step()
    opt.zero_grad()
    mark("step %d optimizer" % step)
params = [p.full_tensor() for p in m.parameters()]
mark("full_tensor x%d" % len(params))
print("PROBE rank %d python-level all_gather calls: %r" % (rank, seen), flush=True)
torch.cuda.synchronize()
dist.barrier()
dist.destroy_process_group()
