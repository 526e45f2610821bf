"""The GPU fast path when the ranks disagree (2 ranks): rank 0 all-reduces 8 floats (fast
path) while rank 1 all-reduces `argv[1]` floats: 16 (fast path too, another size) or 8M (32 MiB:
the plan path). The daemon reports the mismatch; every rank must then get an error from that
collective or the next one, and its GPU must not hang (a fast kernel waiting for a peer's
flag is released)."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
from common import Checker, announce

local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=60))
rank, W = dist.get_rank(), dist.get_world_size()
announce(rank)
chk = Checker(rank)
other = int(sys.argv[1]) if len(sys.argv) > 1 else 16

# A few good fast ops first: the path is warm.
for _ in range(3):
    t = torch.ones(8, device=dev)
    dist.all_reduce(t)
torch.cuda.synchronize()


def disagree():
    t = torch.ones(8 if rank == 0 else other, device=dev)
    error = None
    t0 = time.time()
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
        # The failure may come after wait() returned: the next call reports it.
        time.sleep(1.0)
        u = torch.ones(8, device=dev)
        dist.all_reduce(u)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        error = "%s: %s" % (type(e).__name__, e)
    torch.cuda.synchronize()  # must return: no kernel may still wait for a flag
    took = time.time() - t0
    if error is None:
        return "no error although the ranks disagreed"
    if "disagree" not in error and "mismatch" not in error.lower() and "differ" not in error:
        return "the error does not say the ranks disagree: %s" % error[:300]
    if took > 30:
        return "took %.1f s" % took
    print("rank %d got: %s" % (rank, error[:200]), flush=True)
    return None


chk.run("fast_path_disagreement.%d" % other, disagree)
sys.exit(chk.finish())
