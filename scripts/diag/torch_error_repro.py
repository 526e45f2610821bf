"""One bad-input call on a single-rank smddp group (launch path 2), chosen by argv[1]; prints
what Python saw. Used to diagnose errors crossing torch's c10d bindings."""
import faulthandler
import os
import sys

import torch
import torch.distributed as dist

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
from smdistributed.dataparallel.torch import _smddp_c

faulthandler.enable()
case = sys.argv[1]
dist.init_process_group(backend="smddp", rank=0, world_size=1)
pg = dist.group.WORLD
be = pg._get_backend(torch.device("cpu")) if hasattr(pg, "_get_backend") else pg
print("backend object:", type(be), flush=True)
try:
    if case == "ok":
        t = torch.ones(4)
        dist.all_reduce(t)
        print("ok result", t.tolist(), flush=True)
    elif case == "raise_for_test":
        _smddp_c._raise_for_test(1, "test message")
    elif case == "dist_noncontig":
        dist.all_reduce(torch.zeros(4, 4).t())
    elif case == "backend_noncontig":
        be.allreduce([torch.zeros(4, 4).t()]).wait()
    elif case == "dist_dtype":
        dist.all_reduce(torch.zeros(4, dtype=torch.complex64))
    elif case == "dist_broadcast_bad_root":
        dist.broadcast(torch.zeros(4), src=5)
    elif case == "pg_noncontig":
        pg.allreduce([torch.zeros(4, 4).t()]).wait()
    print("NO EXCEPTION", flush=True)
except Exception as e:  # noqa: BLE001
    print("CAUGHT", type(e).__module__, type(e).__name__, str(e)[:200], flush=True)
dist.destroy_process_group()
print("DONE", case, flush=True)
