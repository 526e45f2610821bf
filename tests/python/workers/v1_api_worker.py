"""A script written against the old smdistributed v1 API trains with smddp."""

import torch
import torch.nn as nn

import smdistributed.dataparallel.torch.distributed as sdist
from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP

from common import Checker, announce

torch.set_num_threads(1)
sdist.init_process_group()
sdist.init_process_group()  # idempotent
rank, W = sdist.get_rank(), sdist.get_world_size()
announce(rank)
chk = Checker(rank)


def check_basics():
    if not (sdist.is_available() and sdist.is_initialized()):
        return "not available/initialized"
    if sdist.get_local_rank() != rank or sdist.get_local_size() != W:  # one node
        return "local rank/size %d/%d" % (sdist.get_local_rank(), sdist.get_local_size())
    t = torch.full((4,), float(rank + 1))
    sdist.all_reduce(t, op=sdist.ReduceOp.AVERAGE)
    if not bool((t == sum(range(1, W + 1)) / W).all()):
        return "AVERAGE gave %s" % t.tolist()
    t = torch.full((4,), float(rank))
    sdist.all_reduce(t, op=sdist.ReduceOp.MAX)
    if not bool((t == W - 1).all()):
        return "MAX gave %s" % t.tolist()
    b = torch.full((2,), float(rank))
    sdist.broadcast(b, src=W - 1)
    if not bool((b == W - 1).all()):
        return "broadcast gave %s" % b.tolist()
    outs = [torch.zeros(2) for _ in range(W)]
    sdist.all_gather(outs, torch.full((2,), float(rank)))
    if [o[0].item() for o in outs] != [float(r) for r in range(W)]:
        return "all_gather gave %s" % outs
    inp = torch.arange(W, dtype=torch.float32) + rank * 10
    out = torch.zeros(W)
    sdist.all_to_all_single(out, inp)
    if out.tolist() != [float(r * 10 + rank) for r in range(W)]:
        return "all_to_all_single gave %s" % out.tolist()
    sdist.barrier()


def check_training():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    ddp = DDP(model, broadcast_buffers=False)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    torch.manual_seed(1)
    x, y = torch.randn(8 * W, 4), torch.randn(8 * W, 1)
    xs, ys = x[rank * 8:(rank + 1) * 8], y[rank * 8:(rank + 1) * 8]
    with torch.no_grad():
        full_before = nn.functional.mse_loss(model(x), y).item()
    losses = []
    for step in range(20):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(xs), ys)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if rank == 0:
            print("v1 step %d loss %.6f" % (step, loss.item()), flush=True)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    outs = [torch.zeros_like(flat) for _ in range(W)]
    sdist.all_gather(outs, flat)
    if not all(torch.equal(o, flat) for o in outs):
        return "ranks' parameters differ"
    # The full-batch loss must fall (one rank's shard loss may rise with more ranks).
    with torch.no_grad():
        full_after = nn.functional.mse_loss(model(x), y).item()
    if not full_after < full_before:
        return "full-batch loss did not decrease: %g -> %g (this rank's losses %s)" % (full_before, full_after, losses)


chk.run("v1.basics", check_basics)
chk.run("v1.training", check_training)
sdist.barrier()
raise SystemExit(chk.finish())
