# Two async in-place all_reduces of one host tensor, no wait between (2 ranks). Each rank prints
# how many of its 20 results were wrong; 0 since commit 3602d54 (on 9ebc5fa: 19 of 20 wrong).
#   build/bin/smddprun --nproc-per-node 2 -- /usr/bin/python3 scripts/diag/chained_ops_repro.py
import os, torch, torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa
dist.init_process_group("smddp")
r, w = dist.get_rank(), dist.get_world_size()
bad = 0
for n in [1, 1000, 300000, 3 << 20]:
    for trial in range(5):
        t = torch.full((n,), float(r + 1))
        a = dist.all_reduce(t, async_op=True)
        b = dist.all_reduce(t, async_op=True)
        a.wait(); b.wait()
        want = float(sum(range(1, w + 1))) * w
        if not torch.all(t == want):
            bad += 1
            if r == 0: print("n=%d trial %d: got %s want %s" % (n, trial, t[:3].tolist(), want), flush=True)
print("rank %d bad %d" % (r, bad), flush=True)
dist.destroy_process_group()
