"""A randomized workload of host-tensor collectives, every result checked against a reference.

argv: --ops N (default 1000) --seed S (default 1). Every rank draws the same sequence from the
seed: the collective (allreduce, broadcast, reduce, all_gather in both forms, reduce_scatter,
all_to_all_single, gather, scatter, send/recv, barrier), the group (the world, one rank a node,
the node's ranks), the dtype, the size (0 elements to 16 MiB, mostly small), the reduce op and
the root, and whether it is issued asynchronously (up to 4 in flight, waited in issue order).
Members of the drawn group run it; the others go on to the next.

After a warm-up (the first tenth of the operations, at least 50, then the largest operations
once in each group) and at the end, rank 0 prints what the ranks and the node's daemon hold
("SMDDP-RESOURCES <when> <json>": private resident memory, open fds, threads, this job's /dev/shm
bytes), each rank its own share via the Store; the test compares them."""

import json
import os
import random
import sys

import torch
import torch.distributed as dist

from common import Checker, init, pattern

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}

args = sys.argv[1:]
OPS = int(args[args.index("--ops") + 1]) if "--ops" in args else 1000
SEED = int(args[args.index("--seed") + 1]) if "--seed" in args else 1

rank, W = init()
chk = Checker(rank)
per_node = int(os.environ.get("LOCAL_WORLD_SIZE", W))
nodes = W // per_node
# Groups: every group is made by every rank, in the same order (c10d's rule).
groups = {"world": (None, list(range(W)))}
cross = [[n * per_node + i for n in range(nodes)] for i in range(per_node)]   # one rank a node
inside = [[n * per_node + i for i in range(per_node)] for n in range(nodes)]  # a node's ranks
for kind, lists in (("cross", cross), ("inside", inside)):
    for members in lists:
        g = dist.new_group(members)
        if rank in members:
            groups[kind] = (g, members)
KINDS = [k for k in ("world", "cross", "inside") if k in groups]

NUMBERS = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
SIZES = [0, 1, 7, 64, 1000, 4096, 65536, 262147]  # elements; plus, rarely, 16 MiB of them
rng = random.Random(SEED)


def draw():
    op = rng.choice(["allreduce", "allreduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                     "reduce_scatter", "all_to_all_single", "gather", "scatter", "send_recv", "barrier"])
    kind = rng.choice(["world", "world", "cross", "inside"])
    dname = rng.choice(NUMBERS + ["bool"]) if op != "reduce_scatter" else rng.choice(NUMBERS)
    n = rng.choice(SIZES) if rng.random() > 0.005 else (16 << 20) // torch.empty(0, dtype=DTYPES[dname]).element_size()
    red = rng.choice(["SUM", "MAX", "MIN", "PRODUCT"])
    root_pick = rng.random()
    async_op = rng.random() < 0.3
    return op, kind, dname, n, red, root_pick, async_op


TILE = 65537  # prime: a block of a large operation never lines up with the tile


def values(r, n, dname, salt, red="SUM"):
    """Rank r's input of operation `salt`: common.pattern, tiled beyond TILE elements (hashing
    16 Mi elements per member on every rank took most of the run on two cores)."""
    kind = "prod" if red == "PRODUCT" else "small"
    base = pattern((r + salt) % 64, min(n, TILE), DTYPES[dname], kind)
    return base if n <= TILE else base.repeat((n + TILE - 1) // TILE)[:n]


def reduced(stack, red, dname):
    if dname == "bool":
        return stack.any(0) if red in ("SUM", "MAX") else stack.all(0)
    wide = stack.double() if DTYPES[dname].is_floating_point else stack.to(torch.int64)
    out = {"SUM": lambda: wide.sum(0), "MAX": lambda: wide.max(0).values, "MIN": lambda: wide.min(0).values,
           "PRODUCT": lambda: wide.prod(0)}[red]()
    return out.to(DTYPES[dname])


def same(got, want):
    if got.shape != want.shape or not torch.equal(got, want):
        return "got %s... want %s..." % (got.flatten()[:6].tolist(), want.flatten()[:6].tolist())
    return None


def issue(i, op, g, members, dname, n, red, root, async_op):
    """Issues one collective; returns (work or None, check) where check() -> None or an error."""
    me = members.index(rank)
    m = len(members)
    salt = i % 61
    red_op = getattr(dist.ReduceOp, red)
    if op == "allreduce":
        t = values(rank, n, dname, salt, red)
        w = dist.all_reduce(t, op=red_op, group=g, async_op=async_op)
        want = reduced(torch.stack([values(r, n, dname, salt, red) for r in members]), red, dname) if n else t
        return w, lambda: same(t, want)
    if op == "broadcast":
        t = values(rank, n, dname, salt)
        w = dist.broadcast(t, src=members[root], group=g, async_op=async_op)
        return w, lambda: same(t, values(members[root], n, dname, salt))
    if op == "reduce":
        t = values(rank, n, dname, salt, red)
        w = dist.reduce(t, dst=members[root], op=red_op, group=g, async_op=async_op)
        if me != root:
            return w, lambda: None
        want = reduced(torch.stack([values(r, n, dname, salt, red) for r in members]), red, dname) if n else t
        return w, lambda: same(t, want)
    if op == "all_gather":
        out = [torch.zeros(n, dtype=DTYPES[dname]) for _ in members]
        w = dist.all_gather(out, values(rank, n, dname, salt), group=g, async_op=async_op)
        return w, lambda: same(torch.stack(out), torch.stack([values(r, n, dname, salt) for r in members]))
    if op == "all_gather_into_tensor":
        out = torch.zeros(m * n, dtype=DTYPES[dname])
        w = dist.all_gather_into_tensor(out, values(rank, n, dname, salt), group=g, async_op=async_op)
        return w, lambda: same(out, torch.cat([values(r, n, dname, salt) for r in members]))
    if op == "reduce_scatter":
        full = values(rank, m * n, dname, salt, red)
        out = torch.zeros(n, dtype=DTYPES[dname])
        w = dist.reduce_scatter_tensor(out, full, op=red_op, group=g, async_op=async_op)
        whole = reduced(torch.stack([values(r, m * n, dname, salt, red) for r in members]), red, dname)
        return w, lambda: same(out, whole[me * n:(me + 1) * n])
    if op == "all_to_all_single":
        k = max(1, n // max(1, m))
        inp = values(rank, m * k, dname, salt)
        out = torch.zeros(m * k, dtype=DTYPES[dname])
        w = dist.all_to_all_single(out, inp, group=g, async_op=async_op)
        want = torch.cat([values(r, m * k, dname, salt)[me * k:(me + 1) * k] for r in members])
        return w, lambda: same(out, want)
    if op == "gather":
        lst = [torch.zeros(n, dtype=DTYPES[dname]) for _ in members] if me == root else None
        w = dist.gather(values(rank, n, dname, salt), gather_list=lst, dst=members[root], group=g, async_op=async_op)
        if me != root:
            return w, lambda: None
        return w, lambda: same(torch.stack(lst), torch.stack([values(r, n, dname, salt) for r in members]))
    if op == "scatter":
        out = torch.zeros(n, dtype=DTYPES[dname])
        lst = [values(r, n, dname, salt) for r in members] if me == root else None
        w = dist.scatter(out, scatter_list=lst, src=members[root], group=g, async_op=async_op)
        return w, lambda: same(out, values(rank, n, dname, salt))
    if op == "send_recv":
        # The root sends to the next member, who receives; a group of one has no pair.
        if m < 2 or me not in (root, (root + 1) % m):
            return None, lambda: None
        if me == root:
            dist.send(values(rank, n, dname, salt), dst=members[(root + 1) % m], group=g)
            return None, lambda: None
        t = torch.zeros(n, dtype=DTYPES[dname])
        dist.recv(t, src=members[root], group=g)
        return None, lambda: same(t, values(members[root], n, dname, salt))
    w = dist.barrier(group=g, async_op=async_op)
    return w, lambda: None


def resources(daemon_pid):
    def status(pid):
        fields = {}
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                fields[k] = v.split()
        # RssAnon, not VmRSS: VmRSS also counts the pages of the shared arenas a process has
        # touched, and which arena pages an operation lands on depends on what else is in flight.
        return {"anon_kib": int(fields["RssAnon"][0]), "threads": int(fields["Threads"][0]),
                "fds": len(os.listdir("/proc/%d/fd" % pid))}
    job = os.environ.get("SMDDP_JOB_ID", "")
    shm = sum(os.path.getsize("/dev/shm/" + f) for f in os.listdir("/dev/shm") if f.startswith("smddp." + job))
    mine = {"rank": status(os.getpid())}
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        mine["daemon"] = status(daemon_pid)
        mine["shm_bytes"] = shm
    return mine


def report(when, daemon_pid):
    dist.barrier()
    got = [None] * W
    dist.all_gather_object(got, resources(daemon_pid))
    if rank == 0:
        print("SMDDP-RESOURCES %s %s" % (when, json.dumps(got)), flush=True)


from smdistributed.dataparallel.torch import _smddp_c  # noqa: E402
daemon_pid = (_smddp_c.client_info() or {}).get("daemon_pid", 0)
warm = max(50, OPS // 10)
pending = []  # (name, work, check): async operations in issue order


def settle():
    for name, w, check in pending:
        chk.run(name, lambda w=w, check=check: (w.wait(), check())[1])
    pending.clear()


def warm_largest():
    """The largest operations once in each group kind, so that the allocators and the daemons'
    staging pools hold what the workload can take before the start is measured."""
    n = (16 << 20) // 4
    for kind in KINDS:
        g, members = groups[kind]
        t = torch.ones(n)
        dist.all_reduce(t, group=g)
        dist.all_gather_into_tensor(torch.empty(n * len(members)), t, group=g)
        dist.reduce_scatter_tensor(torch.empty(n // len(members)), t, group=g)
        dist.all_to_all_single(torch.empty(n), t, group=g)
        dist.broadcast(t, src=members[0], group=g)


for i in range(OPS):
    if i == warm:
        settle()
        warm_largest()
        report("start", daemon_pid)
    op, kind, dname, n, red, root_pick, async_op = draw()
    if kind not in groups:
        continue
    g, members = groups[kind]
    if rank not in members:
        continue
    root = int(root_pick * len(members))
    if op == "send_recv" or len(pending) >= 4:
        settle()
    name = "%d.%s.%s.%s.n%d%s" % (i, op, kind, dname, n, ".async" if async_op else "")
    try:
        w, check = issue(i, op, g, members, dname, n, red, root, async_op)
    except Exception as e:  # noqa: BLE001 - reported as this operation's failure
        chk.report(name, False, "%s: %s" % (type(e).__name__, e))
        continue
    if async_op and w is not None:
        pending.append((name, w, check))
    else:
        chk.run(name, check)
settle()
report("end", daemon_pid)
dist.barrier()
rc = chk.finish()
dist.destroy_process_group()
sys.exit(rc)
