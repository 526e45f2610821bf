"""new_group with smddp: {0, 2} and {1, 3} of 4 ranks side by side, a gloo group beside them,
and the world group still right afterwards."""

import torch
import torch.distributed as dist

from common import Checker, close, init

rank, W = init()
assert W == 4, "run with 4 ranks"
chk = Checker(rank)
even = dist.new_group([0, 2])
odd = dist.new_group([1, 3])
gloo_even = dist.new_group([0, 2], backend="gloo")
mine = even if rank % 2 == 0 else odd
members = [0, 2] if rank % 2 == 0 else [1, 3]


def check_subgroup_allreduce():
    t = torch.full((6,), float(rank + 1))
    dist.all_reduce(t, group=mine)
    return close(t, torch.full((6,), float(sum(m + 1 for m in members))))


def check_subgroup_vs_gloo():
    if rank % 2:
        return None
    t = torch.arange(7, dtype=torch.float32) * (rank + 1)
    g = t.clone()
    dist.all_reduce(t, group=even, op=dist.ReduceOp.MAX)
    dist.all_reduce(g, group=gloo_even, op=dist.ReduceOp.MAX)
    return close(t, g)


def check_subgroup_collectives():
    out = [torch.zeros(3) for _ in range(2)]
    dist.all_gather(out, torch.full((3,), float(rank)), group=mine)
    err = close(torch.stack(out), torch.stack([torch.full((3,), float(m)) for m in members]))
    if err:
        return "all_gather: " + err
    b = torch.full((2,), float(rank))
    dist.broadcast(b, src=members[1], group=mine)  # src is a global rank
    err = close(b, torch.full((2,), float(members[1])))
    if err:
        return "broadcast: " + err
    dist.barrier(group=mine)
    if dist.get_rank(mine) != members.index(rank) or dist.get_world_size(mine) != 2:
        return "group rank/size wrong"


def check_world_after():
    t = torch.ones(3)
    dist.all_reduce(t)
    return close(t, torch.full((3,), float(W)))


def check_interleaved():
    # World and subgroup collectives interleaved, asynchronously.
    a = torch.ones(2)
    b = torch.ones(2)
    wa = dist.all_reduce(a, async_op=True)
    wb = dist.all_reduce(b, group=mine, async_op=True)
    wb.wait()
    wa.wait()
    return close(a, torch.full((2,), float(W))) or close(b, torch.full((2,), 2.0))


def check_all_rank_group():
    everyone = dist.new_group(list(range(W)))
    t = torch.full((2,), float(rank))
    dist.all_reduce(t, group=everyone)
    return close(t, torch.full((2,), float(sum(range(W)))))


chk.run("subgroup.allreduce", check_subgroup_allreduce)
chk.run("subgroup.vs_gloo", check_subgroup_vs_gloo)
chk.run("subgroup.collectives", check_subgroup_collectives)
chk.run("subgroup.world_after", check_world_after)
chk.run("subgroup.interleaved", check_interleaved)
chk.run("subgroup.all_ranks_group", check_all_rank_group)

dist.barrier()
dist.destroy_process_group()
raise SystemExit(chk.finish())
