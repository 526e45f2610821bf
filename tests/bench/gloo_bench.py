#!/usr/bin/python3
"""gloo_bench.py: the smddp-bench sweep through torch.distributed (gloo by default).

Same flags and nccl-tests-style report as smddp-bench and mpi-bench, so
scripts/bench_cpu.sh can put them side by side. Run under /usr/bin/python3 (it has torch).

Ranks come from, in this order:
  * RANK/WORLD_SIZE (env://: smddprun, torchrun or a parent),
  * OMPI_COMM_WORLD_RANK/SIZE (mpirun -np N /usr/bin/python3 gloo_bench.py ...),
  * otherwise this process starts --nproc children itself on 127.0.0.1.

  /usr/bin/python3 gloo_bench.py --nproc 2 -o allreduce -b 8 -e 64M -f 4
  smddprun --nproc-per-node 2 -- /usr/bin/python3 gloo_bench.py --backend smddp -o allgather

torch collectives that work in place (allreduce, reduce, broadcast) run in place on the
output buffer when timed; the checked run first copies the input there.
"""

import argparse
import functools
import os
import socket
import subprocess
import sys
import time

PREMUL_SCALE = 0.5  # as smddp-bench (check_values.hpp)
OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall",
       "reduce", "gather", "scatter", "sendrecv")
REDUCTIONS = ("allreduce", "reducescatter", "reduce")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
IN_PLACE = ("allreduce", "reduce", "broadcast")
DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "double": "float64", "fp64": "float64",
                 "half": "float16", "fp16": "float16", "bf16": "bfloat16", "int": "int32"}
REDOP_ALIASES = {"product": "prod", "average": "avg"}
UNSIGNED = ("uint8", "bool")
# Relative tolerance for AVG's rounding (a couple of ulps), as check_values.cpp.
TOLERANCE = {"float32": 2e-6, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1.6e-2}


class Unsupported(Exception):
    """The backend cannot run this collective/dtype/op."""


def parse_size(text):
    shift = {"k": 10, "m": 20, "g": 30}.get(text[-1:].lower(), 0)
    digits = text[:-1] if shift else text
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"'{text}' is not a size")
    return int(digits) << shift


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", dest="op", choices=OPS, default="allreduce")
    p.add_argument("-b", dest="min_bytes", type=parse_size, default=32 << 20)
    p.add_argument("-e", dest="max_bytes", type=parse_size, default=32 << 20)
    p.add_argument("-f", dest="factor", type=float, default=1.0)
    p.add_argument("-i", dest="step", type=parse_size, default=1 << 20)
    p.add_argument("-d", dest="dtype", default="float32")
    p.add_argument("-r", dest="redop", default="sum")
    p.add_argument("-R", dest="root", type=int, default=0)
    p.add_argument("-c", dest="check", type=int, default=1)
    p.add_argument("-n", dest="iters", type=int, default=20)
    p.add_argument("-w", dest="warmup", type=int, default=5)
    p.add_argument("-z", dest="blocking", action="store_true", help="ignored (calls always block)")
    p.add_argument("--backend", default="gloo", help="gloo (default) or smddp")
    p.add_argument("--nproc", type=int, default=2, help="ranks to start when none were started for us")
    p.add_argument("--master-port", type=int, default=None)
    a = p.parse_args(argv)
    a.dtype = DTYPE_ALIASES.get(a.dtype, a.dtype)
    a.redop = REDOP_ALIASES.get(a.redop, a.redop)
    if a.max_bytes < a.min_bytes:
        p.error("-e must not be below -b")
    if a.iters < 1 or a.warmup < 0:
        p.error("-n must be >= 1 and -w >= 0")
    return a


def sweep_sizes(a):
    sizes, s = [], a.min_bytes
    while s <= a.max_bytes:
        sizes.append(s)
        nxt = max(s + 1, int(s * a.factor)) if a.factor > 1 else s + a.step
        if nxt <= s:
            break
        s = nxt
    return sizes


def layout(op, nbytes, elem, n):
    """(count, in_elems, out_elems, size_bytes) as collectives.cpp."""
    total = nbytes // elem
    if op in ("allgather", "gather"):
        count = total // n
        ins, outs = count, count * n
    elif op in ("reducescatter", "scatter"):
        count = total // n
        ins, outs = count * n, count
    elif op == "alltoall":
        count = total // n
        ins = outs = count * n
    else:
        count = ins = outs = total
    return count, ins, outs, max(ins, outs) * elem


def bus_factor(op, n):
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reducescatter", "alltoall", "gather", "scatter"):
        return (n - 1) / n
    return 1.0


# ----------------------------------------------------------------------------- check values

class Values:
    """Inputs and expected outputs, the same numbers as check_values.cpp."""

    def __init__(self, torch, op, dtype_name, redop):
        self.torch, self.op, self.dtype_name, self.redop = torch, op, dtype_name, redop
        self.dtype = getattr(torch, "bool" if dtype_name == "bool" else dtype_name)

    def raw_input(self, rank, n_elems):
        t = self.torch
        idx = t.arange(n_elems, dtype=t.int64)
        h = (idx % 97) * 5 + rank * 3
        unsigned = self.dtype_name in UNSIGNED
        if self.dtype_name == "bool":
            return (h % 3 == 0).to(t.float64)
        if self.op not in REDUCTIONS:
            v = ((idx % 97) + 13 * rank) % 97
            return (v if unsigned else v - 48).to(t.float64)
        if self.redop == "prod":
            table = t.tensor([1.0, 2.0, 1.0] if unsigned else [1.0, 2.0, -1.0], dtype=t.float64)
            return table[h % 3]
        v = h % 7
        return (v if unsigned else v - 3).to(t.float64)

    def cast(self, raw):
        if self.dtype_name == "bool":
            return raw != 0
        if not self.dtype.is_floating_point:
            return raw.to(self.torch.int64).to(self.dtype)  # wraps like the C++ store
        return raw.to(self.torch.float32).to(self.dtype) if self.dtype_name in ("float16", "bfloat16") \
            else raw.to(self.dtype)

    def input(self, rank, n_elems):
        return self.cast(self.raw_input(rank, n_elems))

    def reduced(self, n, n_elems):
        t = self.torch
        stack = t.stack([self.raw_input(r, n_elems) for r in range(n)])
        r = self.redop
        if r in ("sum", "avg", "premul_sum"):
            out = stack.sum(0)
            if r == "avg":
                out = out / n
            if r == "premul_sum":
                out = out * PREMUL_SCALE
            return out
        if r == "prod":
            return stack.prod(0)
        if r == "min":
            return stack.min(0).values
        if r == "max":
            return stack.max(0).values
        fn = {"band": t.bitwise_and, "bor": t.bitwise_or, "bxor": t.bitwise_xor}[r]
        return functools.reduce(fn, stack.to(t.int64)).to(t.float64)

    def expected(self, rank, n, root, count, in_elems):
        """The raw expected output of `rank`, or None where it is undefined."""
        op, t = self.op, self.torch
        mine = slice(rank * count, (rank + 1) * count)
        if op == "allreduce" or (op == "reduce" and rank == root):
            return self.reduced(n, count)
        if op == "reducescatter":
            return self.reduced(n, in_elems)[mine]
        if op == "allgather" or (op == "gather" and rank == root):
            return t.cat([self.raw_input(r, count) for r in range(n)])
        if op == "alltoall":
            return t.cat([self.raw_input(p, in_elems)[mine] for p in range(n)])
        if op == "broadcast":
            return self.raw_input(root, count)
        if op == "scatter":
            return self.raw_input(root, in_elems)[mine]
        if op == "sendrecv":
            return self.raw_input((rank + n - 1) % n, count)
        return None

    def count_wrong(self, out, expected_raw):
        t = self.torch
        if expected_raw is None:
            return 0
        exp = self.cast(expected_raw)
        if self.dtype_name == "bool":
            return int((out.view(t.uint8) != exp.to(t.uint8)).sum())
        if not self.dtype.is_floating_point:
            return int((out != exp).sum())
        got, want = out.to(t.float64), exp.to(t.float64)
        ok = (got - want).abs() <= TOLERANCE[self.dtype_name] * want.abs().clamp(min=1.0)
        return int((~ok).sum())


# ----------------------------------------------------------------------------- collectives

class Collectives:
    """One method per collective: issue it on the default group and wait for it."""

    def __init__(self, dist, torch, backend):
        self.dist, self.torch, self.backend = dist, torch, backend
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.gather_into_tensor = hasattr(dist, "all_gather_into_tensor")
        self.scatter_tensor = hasattr(dist, "reduce_scatter_tensor")

    def redop(self, name):
        R = self.dist.ReduceOp
        table = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX,
                 "band": R.BAND, "bor": R.BOR, "bxor": R.BXOR}
        if hasattr(R, "AVG"):
            table["avg"] = R.AVG
        if name not in table:
            raise Unsupported(f"torch.distributed has no {name} reduce op here")
        return table[name]

    def allreduce(self, inp, out, a):
        self.dist.all_reduce(out, op=self.redop(a.redop))

    def reduce(self, inp, out, a):
        self.dist.reduce(out, a.root, op=self.redop(a.redop))

    def broadcast(self, inp, out, a):
        self.dist.broadcast(out, a.root)

    def allgather(self, inp, out, a):
        if self.gather_into_tensor:
            try:
                self.dist.all_gather_into_tensor(out, inp)
                return
            except RuntimeError:  # gloo in torch 1.13 has no _allgather_base: use the list form
                self.gather_into_tensor = False
        self.dist.all_gather(list(out.chunk(self.n)), inp)

    def reducescatter(self, inp, out, a):
        op = self.redop(a.redop)
        try:
            if self.scatter_tensor:
                self.dist.reduce_scatter_tensor(out, inp, op=op)
            else:
                self.dist.reduce_scatter(out, list(inp.chunk(self.n)), op=op)
        except RuntimeError as e:
            raise Unsupported(f"{self.backend} cannot reduce_scatter: {e}") from e

    def alltoall(self, inp, out, a):
        self.dist.all_to_all_single(out, inp)

    def gather(self, inp, out, a):
        self.dist.gather(inp, list(out.chunk(self.n)) if self.rank == a.root else None, dst=a.root)

    def scatter(self, inp, out, a):
        self.dist.scatter(out, list(inp.chunk(self.n)) if self.rank == a.root else None, src=a.root)

    def sendrecv(self, inp, out, a):
        recv = self.dist.irecv(out, (self.rank + self.n - 1) % self.n)
        send = self.dist.isend(inp, (self.rank + 1) % self.n)
        send.wait()
        recv.wait()


# ----------------------------------------------------------------------------- the sweep

HEADER = """\
# op {op}  minBytes {mn} maxBytes {mx} step: {step} warmup iters: {w} iters: {it} validation: {c}
# Out-of-place only (in-place ops run on the output buffer); each call is waited for before
# the next is issued. time: rank 0's average over the iterations, all ranks barriered before
# each timed batch. #wrong: summed over ranks, from one more run on fresh inputs.
#
#                                                              out-of-place
#       size         count      type   redop    root     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       """


def run_rank(a):
    import torch
    import torch.distributed as dist
    if a.backend == "smddp":
        import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  registers "smddp"
    dist.init_process_group(a.backend, init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    try:
        return sweep(a, torch, dist, rank, n)
    finally:
        dist.destroy_process_group()


def sweep(a, torch, dist, rank, n):
    values = Values(torch, a.op, a.dtype, a.redop)
    coll = Collectives(dist, torch, a.backend)
    issue = getattr(coll, a.op)
    elem = torch.empty(0, dtype=values.dtype).element_size()
    reporter = rank == 0
    if a.op in ROOTED and not 0 <= a.root < n:
        print(f"rank {rank}: root {a.root} is not a rank ({n} ranks)", file=sys.stderr)
        return 1
    if reporter:
        step = f"{a.factor:g}(factor)" if a.factor > 1 else f"{a.step}(bytes)"
        print(f"# gloo_bench.py: {n} ranks, torch {torch.__version__} backend {a.backend}\n# host buffers")
        print(HEADER.format(op=a.op, mn=a.min_bytes, mx=a.max_bytes, step=step, w=a.warmup, it=a.iters,
                            c=int(bool(a.check))), flush=True)
    wrong_total, busbw_sum, rows, last = 0, 0.0, 0, None
    for nbytes in sweep_sizes(a):
        count, in_elems, out_elems, size = layout(a.op, nbytes, elem, n)
        if size == last:
            continue
        last = size
        if size == 0 and a.op == "allgather" and a.backend == "gloo":
            if reporter:  # gloo's allgather of 0 elements dies of SIGFPE (torch 1.13)
                print("# size 0 skipped: gloo's allgather crashes on empty tensors", flush=True)
            continue
        inp = values.input(rank, in_elems)
        out = torch.zeros(out_elems, dtype=values.dtype)
        try:
            for _ in range(a.warmup):
                issue(inp, out, a)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(a.iters):
                issue(inp, out, a)
            seconds = (time.perf_counter() - start) / a.iters
            wrong = None
            if a.check:
                out.fill_(0)
                if a.op in IN_PLACE and (a.op != "broadcast" or rank == a.root):
                    out.copy_(inp[:out_elems])
                issue(inp, out, a)
                local = values.count_wrong(out, values.expected(rank, n, a.root, count, in_elems))
                wrong_t = torch.tensor([local], dtype=torch.int64)
                dist.all_reduce(wrong_t)
                wrong = int(wrong_t.item())
                if local:
                    print(f"rank {rank}: {local} wrong elements at size {size}", file=sys.stderr)
        except (Unsupported, RuntimeError, ValueError) as e:
            print(f"rank {rank}: {a.op} of {size} bytes failed: {e}", file=sys.stderr, flush=True)
            return 1
        algbw = size / seconds / 1e9 if seconds > 0 else 0.0
        busbw = algbw * bus_factor(a.op, n)
        busbw_sum += busbw
        rows += 1
        wrong_total += wrong or 0
        if reporter:
            redop = a.redop if a.op in REDUCTIONS else "none"
            root = a.root if a.op in ROOTED else -1
            wrong_col = f"  {wrong:5d}" if wrong is not None else "    N/A"
            print(f"{size:12d}  {size // elem:12d}  {a.dtype:>8s}  {redop:>6s}  {root:6d}  "
                  f"{seconds * 1e6:7.2f}  {algbw:6.2f}  {busbw:6.2f}{wrong_col}", flush=True)
    if reporter:
        print(f"# Out of bounds values : {wrong_total} {'FAILED' if wrong_total else 'OK'}")
        print(f"# Avg bus bandwidth    : {busbw_sum / rows if rows else 0.0:g} \n#", flush=True)
    return 1 if wrong_total else 0


# ----------------------------------------------------------------------------- launching

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(a, argv):
    """Starts a.nproc ranks of this script with env:// variables and waits for all of them."""
    port = a.master_port or free_port()
    children = []
    for r in range(a.nproc):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.nproc), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(a.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        children.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env))
    codes = [c.wait() for c in children]
    return max(codes, key=abs)


def main(argv):
    a = parse_args(argv)
    env = os.environ
    if "RANK" not in env and "OMPI_COMM_WORLD_RANK" in env:  # started by mpirun
        env["RANK"] = env["OMPI_COMM_WORLD_RANK"]
        env["WORLD_SIZE"] = env["OMPI_COMM_WORLD_SIZE"]
        env.setdefault("LOCAL_RANK", env.get("OMPI_COMM_WORLD_LOCAL_RANK", env["RANK"]))
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(a.master_port or 29517))
    if "RANK" not in env:
        return spawn(a, argv)
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    if "MASTER_PORT" not in env:
        print("gloo_bench.py: RANK is set but MASTER_PORT is not", file=sys.stderr)
        return 2
    return run_rank(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
