"""Helpers for rank scripts: report named checks as 'SMDDP-CHECK <rank> <name> OK|FAIL <detail>'
lines that the pytest side collects, and exit non-zero if any failed."""

import os
import sys
import traceback

import torch


def emit(line):
    """Writes one record line to stdout and, where the test gave SMDDP_TEST_RECORDS (a folder),
    to this process's file in it. Stdout alone is not enough: a launcher that forwards output
    (Open MPI's I/O forwarding reads ranks' stdout and the daemon's stderr separately) can cut a
    line and put another process's text in the middle of it."""
    data = (line + "\n").encode()
    sys.stdout.flush()
    os.write(1, data)
    folder = os.environ.get("SMDDP_TEST_RECORDS")
    if folder:
        fd = os.open(os.path.join(folder, "records.%d" % os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


class Checker:
    def __init__(self, rank):
        self.rank = rank
        self.failed = 0
        self.count = 0

    def report(self, name, ok, detail=""):
        # The harness reads "SMDDP-CHECK rank name status detail" split on spaces.
        if not name or any(c.isspace() for c in name):
            raise ValueError("check name %r must be one word" % name)
        self.count += 1
        if not ok:
            self.failed += 1
        emit("SMDDP-CHECK %d %s %s %s" % (self.rank, name, "OK" if ok else "FAIL", detail.replace("\n", " | ")))

    def run(self, name, fn, *args, **kwargs):
        """Runs fn; a returned string (or raised exception) is a failure."""
        try:
            res = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any failure is reported, not raised
            tb = traceback.format_exc().strip().splitlines()
            self.report(name, False, "%s: %s [%s]" % (type(e).__name__, e, tb[-3] if len(tb) > 2 else ""))
            return
        self.report(name, res is None or res is True, "" if res in (None, True) else str(res))

    def expect(self, name, exc_type, fn, *args, contains=None, **kwargs):
        """fn must raise exc_type (and its message must contain `contains`: a string, or a
        list of strings that must all be there)."""
        needles = [contains] if isinstance(contains, str) else list(contains or ())
        try:
            fn(*args, **kwargs)
        except exc_type as e:
            missing = [n for n in needles if n not in str(e)]
            if missing:
                self.report(name, False, "raised %s without %r: %s" % (type(e).__name__, missing, e))
            else:
                self.report(name, True, "%s: %s" % (type(e).__name__, str(e)[:200]))
            return
        except Exception as e:  # noqa: BLE001
            self.report(name, False, "raised %s, expected %s: %s" % (type(e).__name__, exc_type.__name__, e))
            return
        self.report(name, False, "did not raise %s" % exc_type.__name__)

    def finish(self):
        sys.stdout.flush()
        emit("SMDDP-DONE rank %d checks %d failed %d" % (self.rank, self.count, self.failed))
        return 1 if self.failed else 0


def close(a, b, rtol=0.0, atol=0.0):
    """None if equal within tolerance, else a description of the difference."""
    if a.dtype != b.dtype:
        return "dtype %s != %s" % (a.dtype, b.dtype)
    if a.shape != b.shape:
        return "shape %s != %s" % (tuple(a.shape), tuple(b.shape))
    if a.dtype == torch.bool or not (a.is_floating_point()):
        if torch.equal(a, b):
            return None
        return "values differ: %s vs %s" % (a.flatten()[:8].tolist(), b.flatten()[:8].tolist())
    if torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True):
        return None
    diff = (a.double() - b.double()).abs().max().item()
    return "max abs diff %g: %s vs %s" % (diff, a.flatten()[:8].tolist(), b.flatten()[:8].tolist())


# ---- inputs whose reductions tell the ranks apart ------------------------------------------
# Rank r's input at element i comes from a hash of (r, i) (xorshift steps make it non-linear),
# so that every reduction's expected output varies per element, differs from every rank's own
# input, and differs between the blocks a reduce-scatter hands each rank: a kernel that
# writes zeros or ones, copies one rank's input, or puts a block in the wrong place fails.
# tests/integration/collective_check.cpp builds its bool inputs the same way.

def _mix(r, i):
    """Hash of rank r and the int64 index tensor i; values below 2**31."""
    x = (i * 40503 + (r + 1) * 9973) % 1048576
    x = (x * 48271) % 2147483647
    x = x ^ (x >> 11)
    x = (x * 48271) % 2147483647
    return x ^ (x >> 13)


def _fold(i):
    """i folded to 16 bits (i ^ i >> 16): collective_check.cpp keeps one table of 65536 bool
    masks for its 64 MiB buffers; blocks starting at multiples of 65536 still differ."""
    return (i ^ (i >> 16)) & 0xFFFF


def _element_hash(i):
    """Hash of the int64 index tensor i alone (folded); values below 2**32."""
    i = _fold(i)
    x = (i * 2654435761) % 4294967296
    x = x ^ (x >> 13)
    x = (x * 1540483477) % 4294967296
    return x ^ (x >> 13)


def pattern(r, n, dtype, kind="small", device="cpu"):
    """Rank r's n-element input. bool: element i is true on the ranks whose bit is set in a
    mask of i (elements 0-2, and those folding to them, spell the rank's low three bits, so
    ranks 0-7 all differ; then all ranks, none, or a hashed mix). Numbers, exact in every
    dtype: "small" 1..9 (sums of 8 ranks fit int8), "prod" 1..3, "bits" bits common to all
    ranks (so AND is not 0) or'd with per-rank bits among a mask of the element's (so OR is
    not all ones)."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    e = _element_hash(i)  # the same on every rank
    if dtype == torch.bool:
        mask = torch.where(e % 3 == 0, torch.full_like(e, 0xFF), torch.where(e % 3 == 1, torch.zeros_like(e), (e >> 8) & 0xFF))
        for k, m in enumerate((0xAA, 0xCC, 0xF0)):
            mask = torch.where(_fold(i) == k, torch.full_like(e, m), mask)
        return ((mask >> (r % 8)) & 1).bool()
    x = _mix(r, i)
    if kind == "prod":
        v = x % 3 + 1
    elif kind == "bits":
        common = (e >> 3) & (e >> 9) & 0x3F
        v = common | (x & ~common & (e >> 15) & 0x3F)
    else:
        v = x % 9 + 1
    return v.to(dtype)


def discriminates(inputs, want, block=None):
    """None if the expected output `want` of a reduction over `inputs` (one per rank) can tell
    a right result from a wrong one: it varies, equals no rank's input, and (block: the
    elements each rank gets of a reduce-scatter) its blocks all differ. Else what is wrong."""
    flat = want.flatten()
    if flat.numel() >= 8 and bool((flat == flat[0]).all()):
        return "the expected output is constant (%s)" % flat[0].item()
    for r, x in enumerate(inputs):
        if len(inputs) > 1 and x.shape == want.shape and torch.equal(x, want):
            return "the expected output equals rank %d's input" % r
    if block:
        blocks = flat[:block * len(inputs)].view(len(inputs), block)
        for a in range(len(inputs)):
            for b in range(a):
                if torch.equal(blocks[a], blocks[b]):
                    return "the expected reduce-scatter blocks of ranks %d and %d are the same" % (b, a)
    return None


def announce(rank):
    """Tells the pytest side which job and daemon served this rank and which launch path it
    took: 'SMDDP-JOB <rank> <job id> <daemon pid> <path>' (path 2: the plugin started the
    daemon), so it can check that the daemon is gone and /dev/shm clean after the job."""
    from smdistributed.dataparallel.torch import _launch, _smddp_c
    info = _smddp_c.client_info() or {}
    path = "2" if os.environ.get(_launch.ATTACH_MARKER) == "1" else "1"
    emit("SMDDP-JOB %d %s %s %s" % (rank, info.get("job_id", "?"), info.get("daemon_pid", 0), path))


def init(backend="smddp", timeout=None):
    """timeout: the process group's (a datetime.timedelta), else torch's default."""
    import torch.distributed as dist
    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
    torch.set_num_threads(1)
    dist.init_process_group(backend, **({"timeout": timeout} if timeout else {}))
    announce(dist.get_rank())
    return dist.get_rank(), dist.get_world_size()


def env_int(name, default):
    return int(os.environ.get(name, default))


def chained_on_one_tensor(rank, W, device, sizes):
    """Ops issued back to back on one tensor with no wait between run in issue order, as on
    NCCL's stream and Gloo's queue: two all_reduces, an all_reduce then a broadcast, an
    all_gather then an all_reduce. None if right, else what differs."""
    import torch.distributed as dist
    want = float(sum(range(1, W + 1)))
    for n in sizes:
        t = torch.full((n,), float(rank + 1), device=device)
        works = [dist.all_reduce(t, async_op=True), dist.all_reduce(t, async_op=True)]
        b = torch.full((n,), float(rank + 1), device=device)
        works += [dist.all_reduce(b, async_op=True), dist.broadcast(b, src=W - 1, async_op=True)]
        out = torch.empty(W * n, device=device)
        g = torch.full((n,), float(rank), device=device)
        works += [dist.all_gather_into_tensor(out, g, async_op=True), dist.all_reduce(out, async_op=True)]
        for w in works:
            w.wait()
        err = _first_difference(n, (
            ("allreduce twice", t, torch.full_like(t, want * W)),
            ("allreduce then broadcast", b, torch.full_like(b, want)),
            ("all_gather then allreduce", out,
             torch.arange(W, dtype=torch.float32, device=device).repeat_interleave(n) * W)))
        if err:
            return err
    return None


def chained_list_forms(rank, W, device, sizes):
    """The same for the list forms, whose list tensors the plugin copies itself (flattened
    inputs at issue, outputs when the op ends): an all_gather into a list then an all_reduce of
    list[0], and all_reduces then a reduce_scatter from them."""
    import torch.distributed as dist
    want = float(sum(range(1, W + 1)))
    for n in sizes:
        lst = [torch.full((n,), -1.0, device=device) for _ in range(W)]
        a = dist.all_gather(lst, torch.full((n,), float(rank + 1), device=device), async_op=True)
        b = dist.all_reduce(lst[0], async_op=True)  # rank 0's block: 1.0 once gathered
        xs = [torch.full((n,), float(rank + 1), device=device) for _ in range(W)]
        ws = [dist.all_reduce(x, async_op=True) for x in xs]
        out = torch.empty(n, device=device)
        c = dist.reduce_scatter(out, xs, async_op=True)  # its inputs are flattened at issue
        for w in [a, b] + ws + [c]:
            w.wait()
        err = _first_difference(n, (
            ("all_gather then all_reduce of list[0]", lst[0], torch.full_like(lst[0], float(W))),
            ("all_reduces then reduce_scatter of them", out, torch.full_like(out, want * W))))
        if err:
            return err
    return None


def chained_across_sizes(rank, W, device, big=5_000_000, small=1000):
    """An op on a large tensor and one on a small view of it, back to back both ways round:
    in a node on the GPU path they take different paths (plan above 16 MiB, the fast kernel
    below), which order their own ops by stream but not each other's."""
    import torch.distributed as dist
    want = float(sum(range(1, W + 1)))
    t = torch.full((big,), float(rank + 1), device=device)
    u = torch.full((big,), float(rank + 1), device=device)
    works = [dist.all_reduce(t, async_op=True), dist.all_reduce(t[:small], async_op=True),
             dist.all_reduce(u[:small], async_op=True), dist.all_reduce(u, async_op=True)]
    for w in works:
        w.wait()
    exp = torch.full((big,), want, device=device)
    exp[:small] = want * W
    return _first_difference(big, (("large then a small view of it", t, exp),
                                   ("a small view then the whole", u, exp)))


def _first_difference(n, cases):
    for name, got, exp in cases:
        if not torch.equal(got, exp):
            return "n=%d, %s: %s != %s" % (n, name, got[:3].tolist(), exp[:3].tolist())
    return None
