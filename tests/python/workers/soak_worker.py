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
bytes), each rank its own share via the Store; the test compares them.

Fault mode (test_fault_matrix.py), --fault-dir DIR: each rank writes its pid and its daemon's pid
(DIR/pid.R, DIR/daemon.R) at the start and DIR/ready.R after the warm-up, and on its first failed
operation writes "<unix time> <when it called into smddp> ERROR|WRONG <detail>" to DIR/result.R (ERROR: an exception; WRONG: a
result that differs from the reference), prints it as "RESULT R ..." and exits with status 3 at once. --mismatch-rank R --mismatch-at I:
rank R calls the first world all-reduce from operation I on with one element more than the others.
--malformed-rank R --malformed-at I: before that all-reduce, rank R pushes a descriptor the daemon must
refuse into its own request ring (the test library inject_malformed.cpp, through ctypes).
--pg-timeout S: the groups' timeout in seconds."""

import ctypes
import datetime
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist

from common import Checker, emit, init, pattern

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}

args = sys.argv[1:]
OPS = int(args[args.index("--ops") + 1]) if "--ops" in args else 1000
SEED = int(args[args.index("--seed") + 1]) if "--seed" in args else 1
FAULT_DIR = args[args.index("--fault-dir") + 1] if "--fault-dir" in args else None
MISMATCH_RANK = int(args[args.index("--mismatch-rank") + 1]) if "--mismatch-rank" in args else -1
MISMATCH_AT = int(args[args.index("--mismatch-at") + 1]) if "--mismatch-at" in args else -1
MALFORMED_RANK = int(args[args.index("--malformed-rank") + 1]) if "--malformed-rank" in args else -1
MALFORMED_AT = int(args[args.index("--malformed-at") + 1]) if "--malformed-at" in args else -1
# --pg-timeout S: every group's timeout (a stalled rank fails the others after S seconds).
PG_TIMEOUT = datetime.timedelta(seconds=int(args[args.index("--pg-timeout") + 1])) if "--pg-timeout" in args else None


class FaultChecker(Checker):
    """Fault mode: the first failure is this rank's result; it says so and leaves. `started`: when
    the rank last called into smddp (issued a synchronous operation or began waiting for one), so
    that the test measures how long a rank waited in smddp for its error, not how long it was busy
    with its own work (the references of a 16 MiB operation take seconds on two cores)."""

    started = 0.0

    def _end(self, kind, detail):
        # A file, not only a line: mpirun's output forwarding can glue one rank's line to another's.
        line = "%.6f %.6f %s %s" % (time.time(), self.started, kind, detail.replace("\n", " | "))
        tmp = os.path.join(FAULT_DIR, "result.%d.tmp" % self.rank)
        with open(tmp, "w") as f:
            f.write(line)
        os.rename(tmp, os.path.join(FAULT_DIR, "result.%d" % self.rank))
        try:
            print("RESULT %d %s" % (self.rank, line), flush=True)
            sys.stderr.flush()
        except OSError:
            pass  # the output is gone with an aborted mpirun (EIO); the file is the record
        os._exit(3)

    def report(self, name, ok, detail=""):
        if not ok:
            self._end("ERROR", "%s: %s" % (name, detail))
        # Counted, not printed: once a job aborts, mpirun stops reading the ranks' output, and a
        # rank blocked writing a line could never report its error (the test reads the files).
        self.count += 1

    def run(self, name, fn, *a, **kw):
        try:
            res = fn(*a, **kw)
        except Exception as e:  # noqa: BLE001 - the first failure ends the rank
            self._end("ERROR", "%s: %s: %s" % (name, type(e).__name__, e))
        if res is not None and res is not True:
            self._end("WRONG", "%s: %s" % (name, res))
        self.report(name, True)


def mark(what):
    if FAULT_DIR:
        with open(os.path.join(FAULT_DIR, "%s.%d.tmp" % (what, rank)), "w") as f:
            f.write(str(daemon_pid if what == "daemon" else os.getpid()))
        os.rename(os.path.join(FAULT_DIR, "%s.%d.tmp" % (what, rank)), os.path.join(FAULT_DIR, "%s.%d" % (what, rank)))


rank, W = init(timeout=PG_TIMEOUT)
chk = FaultChecker(rank) if FAULT_DIR else Checker(rank)
per_node = int(os.environ.get("LOCAL_WORLD_SIZE", W))
nodes = W // per_node
# Groups: every group is made by every rank, in the same order (c10d's rule).
groups = {"world": (None, list(range(W)))}
cross = [[n * per_node + i for n in range(nodes)] for i in range(per_node)]   # one rank a node
inside = [[n * per_node + i for i in range(per_node)] for n in range(nodes)]  # a node's ranks
for kind, lists in (("cross", cross), ("inside", inside)):
    for members in lists:
        g = dist.new_group(members, **({"timeout": PG_TIMEOUT} if PG_TIMEOUT else {}))
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
        # n is the output's count: the rare large size (16 MiB) is taken as the input's, as for the
        # other operations. Otherwise its reference (every member's 64 MiB, widened to int64 or
        # double) takes 2 GiB and minutes on two cores, and a rank busy that long when its daemon is
        # killed is ended by the orphan watch (10 s) before it can report.
        if n >= 1 << 20:
            n //= m
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
    # Free heap memory goes back to the system first: what is left is what the rank holds, not
    # what glibc keeps for the next large tensor, which depends on the order of the frees.
    ctypes.CDLL(None).malloc_trim(0)
    got = [None] * W
    dist.all_gather_object(got, resources(daemon_pid))
    if rank == 0:
        # One write, and a record file: a print could be cut by another rank's line in the
        # launcher's forwarded output.
        emit("SMDDP-RESOURCES %s %s" % (when, json.dumps(got)))


from smdistributed.dataparallel.torch import _smddp_c  # noqa: E402
daemon_pid = (_smddp_c.client_info() or {}).get("daemon_pid", 0)
warm = max(50, OPS // 10)
pending = []  # (name, work, check): async operations in issue order
mark("pid")
mark("daemon")
mismatched = False
malformed = False


def post_malformed():
    """Pushes the refused descriptor (inject_malformed.cpp) with nothing else of this rank in flight."""
    settle()
    lib = ctypes.CDLL(os.path.join(os.environ["SMDDP_BUILD_DIR"], "lib", "libsmddp_test_inject.so"))
    info = _smddp_c.client_info()
    seq, err = ctypes.c_uint64(0), ctypes.create_string_buffer(512)
    if lib.smddp_test_post_malformed(info["job_id"].encode(), info["node_id"], info["local_rank"], ctypes.byref(seq),
                                     err, len(err)) != 0:
        raise RuntimeError("could not post the malformed descriptor: " + err.value.decode())
    print("rank %d posted a malformed all-reduce, sequence %d" % (rank, seq.value), flush=True)


def settle():
    for name, w, check in pending:
        chk.started = time.time()
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


def workload():
    global mismatched, malformed
    for i in range(OPS):
        if i == warm:
            settle()
            warm_largest()
            report("start", daemon_pid)
            mark("ready")
        op, kind, dname, n, red, root_pick, async_op = draw()
        if kind not in groups:
            continue
        # Never before the warm-up ends: the test waits for every rank to be ready first.
        if rank == MISMATCH_RANK and i > warm and i >= MISMATCH_AT and not mismatched and op == "allreduce" and kind == "world":
            n, mismatched = n + 1, True
        if rank == MALFORMED_RANK and i > warm and i >= MALFORMED_AT and not malformed and op == "allreduce" and kind == "world":
            chk.started = time.time()
            post_malformed()
            malformed = True
        g, members = groups[kind]
        if rank not in members:
            continue
        root = int(root_pick * len(members))
        if op == "send_recv" or len(pending) >= 4:
            settle()
        name = "%d.%s.%s.%s.n%d%s" % (i, op, kind, dname, n, ".async" if async_op else "")
        chk.started = time.time()
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
    chk.started = time.time()
    report("end", daemon_pid)
    dist.barrier()


try:
    workload()
except Exception as e:  # noqa: BLE001 - fault mode: a failure outside an operation's check
    if not FAULT_DIR:
        raise
    chk._end("ERROR", "%s: %s" % (type(e).__name__, e))
rc = chk.finish()
dist.destroy_process_group()
sys.exit(rc)
