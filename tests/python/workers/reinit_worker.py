"""destroy_process_group() then init_process_group() again, twice: each world group and a
subgroup work every time, whether or not the script keeps smddp group objects in between."""

import gc
import os

import torch
import torch.distributed as dist

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
from common import Checker, announce

torch.set_num_threads(1)
chk = None
BASE_PORT = int(os.environ["MASTER_PORT"])
for round_ in range(3):
    # A fresh store port per round: torch 1.13's env:// re-rendezvous on the port of a store
    # that is still shutting down fails ("Broken pipe"), with any backend.
    os.environ["MASTER_PORT"] = str(BASE_PORT + round_)
    dist.init_process_group("smddp")
    rank, W = dist.get_rank(), dist.get_world_size()
    announce(rank)
    chk = chk or Checker(rank)

    def allreduce_ok():
        t = torch.full((3,), float(rank + round_))
        dist.all_reduce(t)
        want = float(sum(range(W)) + W * round_)
        return None if bool((t == want).all()) else "round %d gave %s, want %s" % (round_, t.tolist(), want)

    chk.run("reinit.round%d" % round_, allreduce_ok)
    sub = dist.new_group(list(range(W)))
    chk.run("reinit.subgroup%d" % round_, lambda: dist.barrier(group=sub))
    if round_ == 1:
        # No group object of the script survives this round (after round 0, `sub` does).
        del sub
        gc.collect()
    dist.destroy_process_group()
raise SystemExit(chk.finish())
