"""Every collective x dtype of the smddp backend on CUDA tensors, checked against an
independently computed reference and against an NCCL group of the same job, at several
sizes; plus Work.wait()/get_future() stream semantics. One GPU per rank (LOCAL_RANK), or
SMDDP_TEST_GPU_BY_RANK=1 (RANK modulo the GPUs) with SMDDP_TEST_NO_NCCL=1 for ranks that share one.

argv: [--big] (adds 256 MiB cases) [--sizes 1,7,65536,1048579] [--hier-only] (only the collectives
that have a hierarchical form across nodes: all_reduce, broadcast, reduce, all_gather and
reduce_scatter, every dtype and op, at every size; for large sizes)"""

import os
import sys

import torch
import torch.distributed as dist

from common import (Checker, chained_across_sizes, chained_list_forms, chained_on_one_tensor, close, discriminates, init,
                    pattern)

# Imported first: it maps the launcher's variables (mpirun's OMPI_COMM_WORLD_LOCAL_RANK) to
# LOCAL_RANK, which picks this rank's GPU.
import smdistributed.dataparallel.torch.torch_smddp  # noqa: E402,F401

local = int(os.environ.get("LOCAL_RANK", "0"))
if os.environ.get("SMDDP_TEST_GPU_BY_RANK") == "1":
    # Simulated nodes share one machine: every node's local rank 0 would pick GPU 0.
    local = int(os.environ["RANK"]) % torch.cuda.device_count()
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
rank, W = init()
# SMDDP_TEST_NO_NCCL=1: the ranks share one GPU (simulated nodes on a 1-GPU machine), which
# NCCL refuses; results are checked against the reference only.
nccl = None if os.environ.get("SMDDP_TEST_NO_NCCL") == "1" else dist.new_group(backend="nccl")
# A second smddp group with the sharded-data-parallel AllGather path (read at creation).
os.environ["SMDATAPARALLEL_OPTIMIZE_SDP"] = "true"
sdp = dist.new_group(backend="smddp")
os.environ.pop("SMDATAPARALLEL_OPTIMIZE_SDP")
chk = Checker(rank)

args = sys.argv[1:]
BIG = "--big" in args
HIER_ONLY = "--hier-only" in args
# 65536: the fast path's vectorized form over many thread blocks.
SIZES = [1, 7, 65536, (1 << 20) + 3]
if "--sizes" in args:
    SIZES = [int(x) for x in args[args.index("--sizes") + 1].split(",")]

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
FLOATS = {"float32", "float64", "float16", "bfloat16"}
TOL = {"float32": 1e-5, "float64": 1e-12, "float16": 1e-2, "bfloat16": 2e-2}


def values(r, n, dname, kind="small"):
    """Rank r's input on the GPU (common.pattern): reductions of it vary per element and per rank."""
    return pattern(r, n, DTYPES[dname], kind, device=dev)


# Sizes at which the inputs are checked to tell right results from wrong ones (common.discriminates):
# too few elements cannot, too many cost time.
def judged(n):
    return 64 <= n <= (1 << 21)


def reference_reduce(stack, op, dname):
    if dname == "bool":
        if op in ("SUM", "MAX", "BOR"):
            return stack.any(0)
        if op in ("PRODUCT", "MIN", "BAND"):
            return stack.all(0)
        return (stack.to(torch.int64).sum(0) % 2).bool()
    wide = stack.double() if dname in FLOATS else stack.to(torch.int64)
    if op == "SUM":
        out = wide.sum(0)
    elif op == "AVG":
        out = wide.sum(0) / W
    elif op == "PREMUL":
        out = (wide * 0.5).sum(0)
    elif op == "PRODUCT":
        out = wide.prod(0)
    elif op == "MIN":
        out = wide.min(0).values
    elif op == "MAX":
        out = wide.max(0).values
    else:
        out = stack[0].clone()
        for t in stack[1:]:
            out = out & t if op == "BAND" else out | t if op == "BOR" else out ^ t
        return out
    return out.to(DTYPES[dname])


def torch_op(op):
    if op == "PREMUL":
        return dist._make_nccl_premul_sum(0.5)
    return getattr(dist.ReduceOp, {"PRODUCT": "PRODUCT"}.get(op, op))


def compare(got, want, dname, nccl_fn=None):
    tol = TOL.get(dname, 0.0)
    # Compared where both lie (the GPU here): copying 64 Mi-element outputs to the host and
    # comparing them there took most of the large sizes' time.
    if got.device != want.device:
        got, want = got.cpu(), want.cpu()
    err = close(got, want, rtol=tol, atol=tol)
    if err:
        return "vs reference: " + err
    if nccl_fn is not None and nccl is not None:
        try:
            g = nccl_fn()
        except (RuntimeError, ValueError) as e:  # NCCL lacks bitwise ops and some dtypes
            if "not supported" in str(e).lower() or "unsupported" in str(e).lower() or "Cannot use" in str(e):
                return None
            raise
        err = close(got, g.to(got.device), rtol=tol, atol=tol)
        if err:
            return "vs nccl: " + err
    return None


def check_allreduce(op, dname, n):
    kind = "prod" if op == "PRODUCT" else "bits" if op in ("BAND", "BOR", "BXOR") else "small"
    t = values(rank, n, dname, kind)
    inputs = [values(r, n, dname, kind) for r in range(W)]
    want = reference_reduce(torch.stack(inputs), op, dname)
    err = discriminates(inputs, want) if judged(n) else None
    if err:
        return "inputs cannot tell: " + err
    dist.all_reduce(t, op=torch_op(op))

    def via_nccl():
        g = values(rank, n, dname, kind)
        dist.all_reduce(g, op=torch_op(op), group=nccl)
        return g
    # NCCL lacks bitwise ops; its bf16 PREMUL_SUM with a scalar factor returns zeros (torch
    # 2.11 + NCCL 2.28, seen on the H200 machine): those compare with the reference only.
    # bool goes to NCCL as uint8 (torch maps SUM to MAX and PRODUCT to MIN for it).
    skip = op in ("BAND", "BOR", "BXOR") or (op == "PREMUL" and dname == "bfloat16")
    return compare(t, want, dname, None if skip else via_nccl)


def check_broadcast(dname, n, root):
    t = values(rank, n, dname)
    dist.broadcast(t, src=root)
    return compare(t, values(root, n, dname), dname)


def check_reduce(dname, n, root):
    t = values(rank, n, dname)
    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
    if rank != root:
        return compare(t, values(rank, n, dname), dname)  # a non-root's tensor is left alone
    return compare(t, reference_reduce(torch.stack([values(r, n, dname) for r in range(W)]), "MAX", dname), dname)


def check_all_gather(dname, n, group=None):
    out = [torch.zeros(n, dtype=DTYPES[dname], device=dev) for _ in range(W)]
    dist.all_gather(out, values(rank, n, dname), group=group)
    return compare(torch.stack(out), torch.stack([values(r, n, dname) for r in range(W)]), dname)


def check_all_gather_into_tensor(dname, n, group=None, in_place=False):
    out = torch.zeros(W * n, dtype=DTYPES[dname], device=dev)
    want = torch.cat([values(r, n, dname) for r in range(W)])
    if in_place:  # FSDP's form: the input is this rank's slot of the output
        mine = out.narrow(0, rank * n, n)
        mine.copy_(values(rank, n, dname))
        dist.all_gather_into_tensor(out, mine, group=group)
    else:
        dist.all_gather_into_tensor(out, values(rank, n, dname), group=group)

    def via_nccl():
        o = torch.zeros(W * n, dtype=DTYPES[dname], device=dev)
        dist.all_gather_into_tensor(o, values(rank, n, dname), group=nccl)
        return o
    return compare(out, want, dname, via_nccl)


def check_reduce_scatter(dname, n, tensor_form, op="SUM"):
    mine = values(rank, W * n, dname)
    if judged(n):
        full = [values(r, W * n, dname) for r in range(W)]
        whole = reference_reduce(torch.stack(full), op, dname)
        err = discriminates(full, whole, block=n)
        if err:
            return "inputs cannot tell: " + err
        want = whole[rank * n:(rank + 1) * n]
        del full, whole
    else:
        # Only this rank's block of every input: all of them, stacked and widened, took about
        # 18 GiB a rank at 64 Mi elements, more than 4 ranks of one 80 GiB GPU have. Each block
        # is cloned so that its whole input goes at once (a slice keeps all of it: 2 GiB of
        # float64 an input).
        want = reference_reduce(
            torch.stack([values(r, W * n, dname)[rank * n:(rank + 1) * n].clone() for r in range(W)]), op, dname)
    out = torch.zeros(n, dtype=DTYPES[dname], device=dev)
    if tensor_form:
        dist.reduce_scatter_tensor(out, mine, op=torch_op(op))
    else:
        dist.reduce_scatter(out, list(mine.chunk(W)), op=torch_op(op))

    def via_nccl():
        o = torch.zeros(n, dtype=DTYPES[dname], device=dev)
        dist.reduce_scatter_tensor(o, mine, op=torch_op(op), group=nccl)
        return o
    return compare(out, want, dname, via_nccl if tensor_form else None)


def block(src, dst, rows, dname):
    v = (torch.arange(rows * 2, dtype=torch.int64, device=dev).view(rows, 2) + src * 7 + dst * 3) % 11
    return (v % 2 == 1) if dname == "bool" else v.to(DTYPES[dname])


def check_all_to_all_single(dname, uneven, scale=1):
    # uneven "idle": the last rank sends and receives nothing (both its tensors are empty).
    if uneven == "idle":
        split = lambda s, d: 0 if W - 1 in (s, d) else (s + d + 1) * scale  # noqa: E731
    elif uneven:
        split = lambda s, d: (s + 2 * d) % 3 * scale  # noqa: E731
    else:
        split = lambda s, d: 2 * scale  # noqa: E731
    send = [split(rank, p) for p in range(W)]
    recv = [split(p, rank) for p in range(W)]
    inp = torch.cat([block(rank, p, send[p], dname) for p in range(W)])
    out = torch.zeros(sum(recv), 2, dtype=DTYPES[dname], device=dev)
    if uneven:
        dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
    else:
        dist.all_to_all_single(out, inp)
    return compare(out, torch.cat([block(p, rank, recv[p], dname) for p in range(W)]), dname)


def check_all_to_all(dname):
    ins = [block(rank, p, 1 + p, dname) for p in range(W)]
    outs = [torch.zeros(1 + rank, 2, dtype=DTYPES[dname], device=dev) for _ in range(W)]
    dist.all_to_all(outs, ins)
    return compare(torch.cat(outs), torch.cat([block(p, rank, 1 + rank, dname) for p in range(W)]), dname)


def check_gather(dname, n, root):
    lst = [torch.zeros(n, dtype=DTYPES[dname], device=dev) for _ in range(W)] if rank == root else None
    dist.gather(values(rank, n, dname), gather_list=lst, dst=root)
    if rank != root:
        return None
    return compare(torch.stack(lst), torch.stack([values(r, n, dname) for r in range(W)]), dname)


def check_scatter(dname, n, root):
    out = torch.zeros(n, dtype=DTYPES[dname], device=dev)
    lst = [values(r, n, dname) for r in range(W)] if rank == root else None
    dist.scatter(out, scatter_list=lst, src=root)
    return compare(out, values(rank, n, dname), dname)


def check_send_recv(dname, n):
    if rank == 0:
        dist.send(values(0, n, dname), dst=1)
        t = torch.zeros(n, dtype=DTYPES[dname], device=dev)
        dist.recv(t, src=1)
        return compare(t, values(1, n, dname), dname)
    if rank == 1:
        t = torch.zeros(n, dtype=DTYPES[dname], device=dev)
        dist.recv(t, src=0)
        dist.send(values(1, n, dname), dst=0)
        return compare(t, values(0, n, dname), dname)
    return None


def check_stream_semantics():
    """The daemon reads inputs only after the work queued before the call on the caller's
    stream, and Work.wait() orders the caller's stream after the daemon's writes: a rank
    whose stream is busy for ~50 ms must still see exact results, without any CPU sync."""
    n = 1 << 22
    t = torch.zeros(n, device=dev)
    torch.cuda._sleep(50_000_000 if rank == 1 else 1000)  # ~25-50 ms of GPU time on rank 1
    t.fill_(rank + 1.0)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    s = t.sum()  # queued on the current stream after wait()
    want = float(sum(range(1, W + 1))) * n
    if s.item() != want:
        return "sum %r != %r" % (s.item(), want)
    # The Future: its value is the output list; waiting on it orders the current stream.
    u = torch.full((n,), float(rank), device=dev)
    fut = dist.all_reduce(u, async_op=True).get_future()
    v = fut.wait()[0]
    if v.data_ptr() != u.data_ptr():
        return "future value is not the output tensor"
    if v.sum().item() != float(sum(range(W))) * n:
        return "future: wrong sum %r" % v.sum().item()
    return None


def check_many_inflight():
    """64 async all-reduces in flight, then one wait each (event pools and rings)."""
    ts = [torch.full((1000 + i,), float(rank + i), device=dev) for i in range(64)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    for i, t in enumerate(ts):
        want = float(sum(r + i for r in range(W)))
        if not torch.all(t == want).item():
            return "tensor %d wrong" % i
    return None


if not HIER_ONLY:
    chk.run("stream_semantics", check_stream_semantics)
    chk.run("many_inflight", check_many_inflight)
    chk.run("chained_async_on_one_tensor", chained_on_one_tensor, rank, W, dev, (5, 600001))
    chk.run("chained_list_forms", chained_list_forms, rank, W, dev, (3, 200003))
    chk.run("chained_across_sizes", chained_across_sizes, rank, W, dev)
for n in SIZES:
    for dname in DTYPES:
        if n >= (1 << 24):
            # Four ranks share one GPU here: the cache of the last dtype's blocks (sizes this one
            # cannot reuse) took the GPU's last 20 GiB at 64 Mi elements on an 80 GiB card.
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        ops = ["SUM", "PRODUCT", "MIN", "MAX"]
        ops += ["AVG", "PREMUL"] if dname in FLOATS else ["BAND", "BOR", "BXOR"]
        for op in ops:
            chk.run("allreduce.%s.n%d.%s" % (op, n, dname), check_allreduce, op, dname, n)
        for root in range(W):
            chk.run("broadcast.root%d.n%d.%s" % (root, n, dname), check_broadcast, dname, n, root)
        chk.run("reduce.n%d.%s" % (n, dname), check_reduce, dname, n, W - 1)
        chk.run("all_gather.n%d.%s" % (n, dname), check_all_gather, dname, n)
        chk.run("all_gather_into_tensor.n%d.%s" % (n, dname), check_all_gather_into_tensor, dname, n)
        chk.run("all_gather_into_tensor_sdp.n%d.%s" % (n, dname), check_all_gather_into_tensor, dname, n, sdp)
        chk.run("all_gather_into_tensor_sdp_inplace.n%d.%s" % (n, dname), check_all_gather_into_tensor, dname, n,
                sdp, True)
        chk.run("reduce_scatter.n%d.%s" % (n, dname), check_reduce_scatter, dname, n, False)
        chk.run("reduce_scatter_tensor.n%d.%s" % (n, dname), check_reduce_scatter, dname, n, True)
        if dname in FLOATS:
            chk.run("reduce_scatter_tensor.AVG.n%d.%s" % (n, dname), check_reduce_scatter, dname, n, True, "AVG")
        if HIER_ONLY:
            continue
        chk.run("gather.n%d.%s" % (n, dname), check_gather, dname, n, 0)
        chk.run("scatter.n%d.%s" % (n, dname), check_scatter, dname, n, W - 1)
        chk.run("send_recv.n%d.%s" % (n, dname), check_send_recv, dname, n)
for dname in ([] if HIER_ONLY else DTYPES):
    chk.run("all_to_all_single.%s" % dname, check_all_to_all_single, dname, False)
    chk.run("all_to_all_single.uneven.%s" % dname, check_all_to_all_single, dname, True)
    chk.run("all_to_all.%s" % dname, check_all_to_all, dname)
# Blocks of tens of thousands of rows, some empty (MoE token routing): copies of real size.
if not HIER_ONLY:
    chk.run("all_to_all_single.uneven_large.float32", check_all_to_all_single, "float32", True, 40000)
    chk.run("all_to_all_single.idle_rank.float32", check_all_to_all_single, "float32", "idle", 1000)
    chk.run("all_to_all_single.idle_rank.int64", check_all_to_all_single, "int64", "idle")
if BIG:
    big = (256 << 20) // 4
    chk.run("allreduce.SUM.256MiB.float32", check_allreduce, "SUM", "float32", big)
    chk.run("allreduce.SUM.256MiB.bfloat16", check_allreduce, "SUM", "bfloat16", big * 2)
    chk.run("allreduce.MAX.256MiB.int32", check_allreduce, "MAX", "int32", big)
    chk.run("all_gather_into_tensor.256MiB.float32", check_all_gather_into_tensor, "float32", big // W)
    chk.run("all_gather_into_tensor_sdp.256MiB.float32", check_all_gather_into_tensor, "float32", big // W, sdp)
    chk.run("reduce_scatter_tensor.256MiB.float32", check_reduce_scatter, "float32", big // W, True)
    chk.run("reduce_scatter_tensor.256MiB.bfloat16", check_reduce_scatter, "bfloat16", big // W, True)



def check_no_context_on_other_gpus():
    # smddp's own threads (progress, callbacks) must not create CUDA contexts on GPUs this rank
    # does not use: each costs about 0.5 GiB there and 100 ms or more when it is created.
    others = [d for d in range(torch.cuda.device_count())
              if d != local and torch._C._cuda_hasPrimaryContext(d)]
    return True if not others else "this rank holds primary CUDA contexts on GPUs %s" % others


def check_freed_memory_returns():
    # A tensor the others mapped (plan path) and this rank then frees must give its memory
    # back once torch empties its cache: the others close their mappings of it when the
    # daemon tells them, with their next plan (torch >= 2.1 reports freed segments). Without
    # that, every round below kept another 256 MiB of this GPU held.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    dist.barrier()
    start = torch.cuda.mem_get_info()[0]
    gone = []
    for _ in range(6):
        x = torch.ones(64 << 20, device=dev)  # 256 MiB: a segment of its own
        dist.all_reduce(x)
        torch.cuda.synchronize()
        del x
        torch.cuda.empty_cache()
        dist.barrier()
        gone.append((start - torch.cuda.mem_get_info()[0]) >> 20)
    # The last two rounds' tensors may still be mapped (their notices ride on later plans).
    return True if gone[-1] <= 768 else "GPU memory this rank freed stays held: MiB gone after each round %s" % gone


torch.cuda.synchronize()
if (int(torch.__version__.split(".")[0]), int(torch.__version__.split(".")[1])) >= (2, 1):
    chk.run("freed_memory_returns", check_freed_memory_returns)
chk.run("no_context_on_other_gpus", check_no_context_on_other_gpus)
dist.barrier()
rc = chk.finish()
dist.destroy_process_group()
sys.exit(rc)
