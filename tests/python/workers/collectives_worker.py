"""Every collective and dtype of the smddp backend, each checked against an independently
computed value and, where Debian's 1.13 gloo runs it, against a gloo group of the same job."""

import time

import torch
import torch.distributed as dist

from common import (Checker, chained_across_sizes, chained_list_forms, chained_on_one_tensor, close, discriminates, init,
                    pattern)

rank, W = init()
gloo = dist.new_group(backend="gloo")
chk = Checker(rank)

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
FLOATS = {"float32", "float64", "float16", "bfloat16"}
TOL = {"float32": 1e-6, "float64": 1e-12, "float16": 1e-2, "bfloat16": 2e-2}
N = 10


def values(r, n, dname, kind="small"):
    """Rank r's input (common.pattern): reductions of it vary per element and per rank."""
    return pattern(r, n, DTYPES[dname], kind)


def reference_reduce(stack, op, dname):
    if dname == "bool":
        s = stack
        if op in ("SUM", "MAX", "BOR"):
            return s.any(0)
        if op in ("PRODUCT", "MIN", "BAND"):
            return s.all(0)
        if op == "BXOR":
            return (s.to(torch.int64).sum(0) % 2).bool()
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
    elif op == "BAND":
        out = stack[0].clone()
        for t in stack[1:]:
            out &= t
    elif op == "BOR":
        out = stack[0].clone()
        for t in stack[1:]:
            out |= t
    elif op == "BXOR":
        out = stack[0].clone()
        for t in stack[1:]:
            out ^= t
    return out.to(DTYPES[dname])


def torch_op(op, tensor_factor=False):
    if op == "PREMUL":
        if not tensor_factor:
            return dist._make_nccl_premul_sum(0.5)
        factor = torch.tensor([0.5], dtype=torch.float64)
        try:  # 1.13 takes a list of tensors, 2.x one tensor
            return dist._make_nccl_premul_sum([factor])
        except TypeError:
            return dist._make_nccl_premul_sum(factor)
    return {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp.AVG, "PRODUCT": dist.ReduceOp.PRODUCT,
            "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX, "BAND": dist.ReduceOp.BAND,
            "BOR": dist.ReduceOp.BOR, "BXOR": dist.ReduceOp.BXOR}[op]


def compare(got, want, dname, gloo_fn=None):
    tol = TOL.get(dname, 0.0)
    err = close(got, want, rtol=tol, atol=tol)
    if err:
        return "vs reference: " + err
    if gloo_fn is not None:
        try:
            g = gloo_fn()
        except Exception:  # noqa: BLE001 - gloo lacks many dtype/op pairs on 1.13
            return None
        err = close(got, g, rtol=tol, atol=tol)
        if err:
            return "vs gloo: " + err
    return None


# ---- allreduce: every (op, dtype) smddp defines -------------------------------------------
def check_allreduce(op, dname, tensor_factor=False):
    kind = "prod" if op == "PRODUCT" else "bits" if op in ("BAND", "BOR", "BXOR") else "small"
    t = values(rank, N, dname, kind)
    inputs = [values(r, N, dname, kind) for r in range(W)]
    want = reference_reduce(torch.stack(inputs), op, dname)
    err = discriminates(inputs, want)
    if err:
        return "inputs cannot tell: " + err
    dist.all_reduce(t, op=torch_op(op, tensor_factor))

    def via_gloo():
        g = values(rank, N, dname, kind)
        dist.all_reduce(g, op=torch_op(op, tensor_factor), group=gloo)
        return g
    return compare(t, want, dname, via_gloo if op != "PREMUL" else None)


for dname in DTYPES:
    ops = ["SUM", "PRODUCT", "MIN", "MAX"]
    ops += ["AVG", "PREMUL"] if dname in FLOATS else ["BAND", "BOR", "BXOR"]
    for op in ops:
        chk.run("allreduce.%s.%s" % (op, dname), check_allreduce, op, dname)
chk.run("allreduce.PREMUL_tensor_factor.float32", check_allreduce, "PREMUL", "float32", True)


# ---- the other collectives, every dtype -----------------------------------------------------
def check_broadcast(dname, root):
    t = values(rank, N, dname)
    dist.broadcast(t, src=root)
    g = values(rank, N, dname)
    return compare(t, values(root, N, dname), dname, lambda: (dist.broadcast(g, src=root, group=gloo), g)[1])


def check_reduce(dname, root):
    t = values(rank, N, dname)
    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
    if rank != root:
        return None
    want = reference_reduce(torch.stack([values(r, N, dname) for r in range(W)]), "MAX", dname)
    return compare(t, want, dname)


def check_all_gather(dname):
    out = [torch.zeros(N, dtype=DTYPES[dname]) for _ in range(W)]
    dist.all_gather(out, values(rank, N, dname))
    got = torch.stack(out)
    want = torch.stack([values(r, N, dname) for r in range(W)])

    def via_gloo():
        o = [torch.zeros(N, dtype=DTYPES[dname]) for _ in range(W)]
        dist.all_gather(o, values(rank, N, dname), group=gloo)
        return torch.stack(o)
    return compare(got, want, dname, via_gloo)


def check_all_gather_into_tensor(dname):
    out = torch.zeros(W, 2, 5, dtype=DTYPES[dname])  # output shape differs from the input's
    dist.all_gather_into_tensor(out, values(rank, N, dname).view(2, 5))
    want = torch.stack([values(r, N, dname).view(2, 5) for r in range(W)])
    return compare(out, want, dname)


RS_BLOCK = 16  # elements each rank gets: enough that every rank's expected block differs


def check_reduce_scatter(dname, tensor_form, op="SUM"):
    full = [values(r, W * RS_BLOCK, dname) for r in range(W)]
    whole = reference_reduce(torch.stack(full), op, dname)
    err = discriminates(full, whole, block=RS_BLOCK)
    if err:
        return "inputs cannot tell: " + err
    want = whole[rank * RS_BLOCK:(rank + 1) * RS_BLOCK]
    out = torch.zeros(RS_BLOCK, dtype=DTYPES[dname])
    if tensor_form:
        dist.reduce_scatter_tensor(out, full[rank], op=torch_op(op))
    else:
        dist.reduce_scatter(out, list(full[rank].chunk(W)), op=torch_op(op))
    return compare(out, want, dname)


def a2a_block(src, dst, rows, dname):
    v = torch.arange(rows * 2, dtype=torch.float64).view(rows, 2) + src * 7 + dst * 3
    v = v % 11
    return (v % 2 == 1) if dname == "bool" else v.to(DTYPES[dname])


def split_rows(src, dst):
    return (src + 2 * dst) % 3  # includes zero-row blocks


def check_all_to_all_single(dname, uneven):
    if uneven:
        send = [split_rows(rank, p) for p in range(W)]
        recv = [split_rows(p, rank) for p in range(W)]
    else:
        send = recv = [2] * W
    inp = torch.cat([a2a_block(rank, p, send[p], dname) for p in range(W)])
    out = torch.zeros(sum(recv), 2, dtype=DTYPES[dname])
    if uneven:
        dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
    else:
        dist.all_to_all_single(out, inp)
    want = torch.cat([a2a_block(p, rank, recv[p], dname) for p in range(W)])

    def via_gloo():
        o = torch.zeros(sum(recv), 2, dtype=DTYPES[dname])
        if uneven:
            dist.all_to_all_single(o, inp.clone(), output_split_sizes=recv, input_split_sizes=send, group=gloo)
        else:
            dist.all_to_all_single(o, inp.clone(), group=gloo)
        return o
    return compare(out, want, dname, via_gloo)


def check_all_to_all_list(dname):
    send = [split_rows(rank, p) + 1 for p in range(W)]
    recv = [split_rows(p, rank) + 1 for p in range(W)]
    inputs = [a2a_block(rank, p, send[p], dname) for p in range(W)]
    outputs = [torch.zeros(recv[p], 2, dtype=DTYPES[dname]) for p in range(W)]
    dist.all_to_all(outputs, inputs)
    return compare(torch.cat(outputs), torch.cat([a2a_block(p, rank, recv[p], dname) for p in range(W)]), dname)


def check_gather(dname, root):
    out = [torch.zeros(N, dtype=DTYPES[dname]) for _ in range(W)] if rank == root else None
    dist.gather(values(rank, N, dname), out, dst=root)
    if rank != root:
        return None
    return compare(torch.stack(out), torch.stack([values(r, N, dname) for r in range(W)]), dname)


def check_scatter(dname, root):
    out = torch.zeros(N, dtype=DTYPES[dname])
    src = [values(r, N, dname) for r in range(W)] if rank == root else None
    dist.scatter(out, src, src=root)
    return compare(out, values(rank, N, dname), dname)


def check_send_recv(dname):
    right, left = (rank + 1) % W, (rank - 1) % W
    out = torch.zeros(N, dtype=DTYPES[dname])
    if rank % 2 == 0:
        dist.send(values(rank, N, dname), right)
        dist.recv(out, left)
    else:
        dist.recv(out, left)
        dist.send(values(rank, N, dname), right)
    return compare(out, values(left, N, dname), dname)


def check_isend_irecv(dname):
    right, left = (rank + 1) % W, (rank - 1) % W
    out = torch.zeros(N, dtype=DTYPES[dname])
    reqs = [dist.isend(values(rank, N, dname), right), dist.irecv(out, left)]
    for r in reqs:
        r.wait()
    return compare(out, values(left, N, dname), dname)


def check_batch_isend_irecv(dname):
    # Both neighbours at once, as pipeline schedules exchange activations and gradients.
    right, left = (rank + 1) % W, (rank - 1) % W
    from_left, from_right = torch.zeros(N, dtype=DTYPES[dname]), torch.zeros(N, dtype=DTYPES[dname])
    ops = [dist.P2POp(dist.isend, values(rank, N, dname), right), dist.P2POp(dist.irecv, from_left, left),
           dist.P2POp(dist.isend, values(rank + W, N, dname), left), dist.P2POp(dist.irecv, from_right, right)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    return compare(from_left, values(left, N, dname), dname) or compare(from_right, values(right + W, N, dname), dname)


for dname in DTYPES:
    chk.run("broadcast.%s" % dname, check_broadcast, dname, W - 1)
    chk.run("reduce.%s" % dname, check_reduce, dname, 1)
    chk.run("all_gather.%s" % dname, check_all_gather, dname)
    chk.run("all_gather_into_tensor.%s" % dname, check_all_gather_into_tensor, dname)
    chk.run("reduce_scatter.%s" % dname, check_reduce_scatter, dname, False)
    chk.run("reduce_scatter_tensor.%s" % dname, check_reduce_scatter, dname, True)
    chk.run("all_to_all_single.even.%s" % dname, check_all_to_all_single, dname, False)
    chk.run("all_to_all_single.uneven.%s" % dname, check_all_to_all_single, dname, True)
    chk.run("all_to_all.%s" % dname, check_all_to_all_list, dname)
    chk.run("gather.%s" % dname, check_gather, dname, 0)
    chk.run("scatter.%s" % dname, check_scatter, dname, 1)
    chk.run("send_recv.%s" % dname, check_send_recv, dname)
    chk.run("isend_irecv.%s" % dname, check_isend_irecv, dname)
    chk.run("batch_isend_irecv.%s" % dname, check_batch_isend_irecv, dname)
for dname in ("float32", "bfloat16", "float16"):
    chk.run("reduce_scatter_tensor.AVG.%s" % dname, check_reduce_scatter, dname, True, "AVG")


# ---- coalesced forms, empty tensors, big tensors ---------------------------------------------
def check_all_reduce_coalesced():
    ts = [values(rank, n, "float32") for n in (3, 0, 7)]
    dist.all_reduce_coalesced(ts)
    for t, n in zip(ts, (3, 0, 7)):
        err = compare(t, reference_reduce(torch.stack([values(r, n, "float32") for r in range(W)]), "SUM",
                                          "float32"), "float32")
        if err:
            return err
    ts2 = [values(rank, 4, "int64"), values(rank, 5, "int64").view(5, 1)]
    dist.all_reduce_coalesced(ts2, op=dist.ReduceOp.MAX)
    want = reference_reduce(torch.stack([values(r, 5, "int64") for r in range(W)]), "MAX", "int64")
    return compare(ts2[1], want.view(5, 1), "int64")


def check_all_gather_coalesced():
    inputs = [values(rank, 3, "float32"), values(rank, 4, "float32").view(2, 2)]
    outs = [[torch.zeros(3), torch.zeros(2, 2)] for _ in range(W)]
    dist.all_gather_coalesced(outs, inputs)
    for r in range(W):
        err = compare(outs[r][0], values(r, 3, "float32"), "float32") or compare(
            outs[r][1], values(r, 4, "float32").view(2, 2), "float32")
        if err:
            return "rank %d block: %s" % (r, err)


def check_empty():
    t = torch.zeros(0)
    dist.all_reduce(t)
    out = torch.zeros(0)
    dist.all_gather_into_tensor(out, torch.zeros(0))
    outs = [torch.zeros(0) for _ in range(W)]
    dist.all_gather(outs, torch.zeros(0))
    dist.broadcast(torch.zeros(0, 3), src=0)
    return None if t.numel() == 0 and out.numel() == 0 else "shapes changed"


def check_large():
    n = 5 * 1024 * 1024 + 3  # 20 MiB of float32: more than one chunk, odd length
    t = torch.full((n,), float(rank + 1))
    t[-1] = rank
    dist.all_reduce(t)
    want = float(sum(range(1, W + 1)))
    if not bool((t[:-1] == want).all()) or t[-1].item() != sum(range(W)):
        return "large allreduce wrong: %s ... %s" % (t[:3].tolist(), t[-3:].tolist())
    big = torch.full((n,), float(rank))
    out = torch.empty(W * n)
    dist.all_gather_into_tensor(out, big)
    for r in range(W):
        if not bool((out[r * n:(r + 1) * n] == r).all()):
            return "large all_gather block %d wrong" % r


chk.run("all_reduce_coalesced", check_all_reduce_coalesced)
chk.run("all_gather_coalesced", check_all_gather_coalesced)
chk.run("empty_tensors", check_empty)
chk.run("large_tensors", check_large)


# ---- Work, futures, objects, barrier, sequence numbers ---------------------------------------
def check_future_without_wait():
    t = torch.ones(1000) * (rank + 1)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    deadline = time.time() + 60
    while not fut.done():  # must complete without anybody calling wait()
        if time.time() > deadline:
            return "future not done after 60 s without wait()"
        time.sleep(0.001)
    if not work.is_completed():
        return "future done but work not completed"
    value = fut.value()
    if not isinstance(value, list) or len(value) != 1 or value[0].data_ptr() != t.data_ptr():
        return "future value is not [the output tensor]: %r" % (type(value),)
    # (Work.exception() cannot be called from Python on 1.13: its binding cannot convert.)
    if not work.is_success():
        return "work reports failure"
    if len(work.result()) != 1:
        return "result() should hold the output tensor"
    return compare(t, torch.full((1000,), float(sum(range(1, W + 1)))), "float32")


def check_future_then():
    t = torch.ones(4) * (rank + 1)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    return compare(fut.wait(), torch.full((4,), 2.0 * sum(range(1, W + 1))), "float32")


def check_many_async():
    ts = [torch.full((17,), float(i + rank)) for i in range(50)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    for i, t in enumerate(ts):
        exp = float(sum(i + r for r in range(W)))
        if not bool((t == exp).all()):
            return "op %d: %s != %s" % (i, t[0].item(), exp)


def check_objects():
    objs = [None] * W
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    if objs != [{"rank": r, "s": "x" * r} for r in range(W)]:
        return "all_gather_object: %r" % objs
    lst = [("hello", rank)] if rank == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    if lst != [("hello", 0)]:
        return "broadcast_object_list: %r" % lst
    gathered = [None] * W if rank == 1 else None
    dist.gather_object({"from": rank, "pad": "y" * (3 * rank)}, gathered, dst=1)
    if rank == 1 and gathered != [{"from": r, "pad": "y" * (3 * r)} for r in range(W)]:
        return "gather_object: %r" % gathered
    got = [None]
    dist.scatter_object_list(got, [("to", r, [r] * r) for r in range(W)] if rank == 0 else None, src=0)
    if got != [("to", rank, [rank] * rank)]:
        return "scatter_object_list: %r" % got


def check_barrier():
    # The last rank arrives late; no rank may leave before it arrived (arrival times shared by
    # an all_reduce afterwards; the ranks share one clock). In both forms.
    late = W - 1
    for form in ("blocking", "async"):
        arrived = 0.0
        if rank == late:
            time.sleep(0.3)
            arrived = time.time()
        if form == "blocking":
            dist.barrier()
        else:
            dist.barrier(async_op=True).wait()
        left = time.time()
        t = torch.tensor([arrived], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if left < t.item():
            return "%s barrier: rank %d left %.3f s before rank %d arrived" % (form, rank, t.item() - left, late)


def check_sequence_number():
    pg = dist.distributed_c10d._get_default_group()
    if hasattr(pg, "_get_backend"):
        # 2.x: the ProcessGroup router answers only for gloo/nccl/ucc; ask our backend.
        pg = pg._get_backend(torch.device("cpu"))
    a = pg._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(1))
    b = pg._get_sequence_number_for_group()
    if b != a + 1:
        return "sequence number %d -> %d after one collective" % (a, b)
    nums = [None] * W
    # Not through gloo: this is the job's last gloo op otherwise, and a gloo worker thread that
    # drops its tensors (which hold Python objects) while the interpreter finalizes aborts the
    # process ("terminate called without an active exception"; pytorch/pytorch PR 179291).
    dist.all_gather_object(nums, b)
    if len(set(nums)) != 1:
        return "ranks disagree on the sequence number: %r" % nums


def check_gpu_work_of_host_tensors():
    # The rank's GPU work counters (what smddp-ctl status sums): host tensors run none.
    from smdistributed.dataparallel.torch import _smddp_c
    w = _smddp_c.gpu_work()
    if w != {"copies": 0}:
        return "gpu_work() after host collectives only: %r" % (w,)


chk.run("gpu_work_of_host_tensors", check_gpu_work_of_host_tensors)
chk.run("future_without_wait", check_future_without_wait)
chk.run("future_then", check_future_then)
chk.run("many_async", check_many_async)
chk.run("chained_async_on_one_tensor", chained_on_one_tensor, rank, W, "cpu", (5, 300001))
chk.run("chained_list_forms", chained_list_forms, rank, W, "cpu", (3, 200003))
chk.run("chained_across_sizes", chained_across_sizes, rank, W, "cpu")
chk.run("objects", check_objects)
chk.run("barrier", check_barrier)
chk.run("sequence_number", check_sequence_number)

dist.barrier()
dist.destroy_process_group()
raise SystemExit(chk.finish())
