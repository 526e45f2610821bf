"""Does GPU memory a rank frees stay held while a peer still has it IPC-mapped?

Each round every rank allocates a fresh 256 MiB tensor, AllReduces it (the peer maps its
segment), frees it and empties torch's cache. Prints how much of this rank's GPU memory is
gone since the start: flat when freed segments go back to the driver, 256 MiB more each round
when the peers' mappings hold them.

    smddprun --nproc-per-node 2 -- python3 scripts/diag/ipc_release_probe.py [rounds]
"""
import os
import sys

import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  registers "smddp"

local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dist.init_process_group("smddp")
rank = dist.get_rank()
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12


def free_bytes():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


warm = torch.ones(1024, device="cuda")
dist.all_reduce(warm)
dist.barrier()
start = free_bytes()
for i in range(rounds):
    x = torch.ones(64 << 20, device="cuda")
    dist.all_reduce(x)
    ok = bool((x == dist.get_world_size()).all())
    del x
    torch.cuda.empty_cache()
    dist.barrier()
    print("PROBE rank %d round %d ok %s gone %d MiB" % (rank, i, ok, (start - free_bytes()) >> 20), flush=True)
dist.destroy_process_group()
