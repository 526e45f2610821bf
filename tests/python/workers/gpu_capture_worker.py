"""CUDA graph capture beside smddp (one GPU per rank).

1. A collective called while the current stream captures a CUDA graph (torch.cuda.graph, in
   each capture error mode) fails at once on every rank with an error that says so, before
   anything is sent: the group goes on, and the collectives after it are right. The fast path,
   the plan path, the SDP AllGather, ReduceScatter, broadcast, AllToAll, and barrier (no tensor:
   it would run on the CPU at capture time, and a replay would skip it).
2. smddp's own threads leave alone a capture the model runs: collectives issued just before a
   capture (their plans, the peers' new buffers opened and their freed ones closed, the
   completions: on smddp's progress thread meanwhile) and the graph captured then (the default,
   global capture mode, in which another thread's event query or IPC call breaks the capture)
   both come out right, and the graph replays right.

argv: [rounds] for part 2 (default 12). SMDDP_TEST_CAPTURE_ONLY=refusal|beside runs one part."""

import faulthandler
import os
import sys

import torch
import torch.distributed as dist

from common import Checker, close, init

import smdistributed.dataparallel.torch.torch_smddp  # noqa: E402,F401

# A run cut by its time limit says where every rank was (SMDDP_TEST_STACKS_AFTER seconds).
if os.environ.get("SMDDP_TEST_STACKS_AFTER"):
    faulthandler.dump_traceback_later(float(os.environ["SMDDP_TEST_STACKS_AFTER"]), exit=False)
local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
rank, W = init()
os.environ["SMDATAPARALLEL_OPTIMIZE_SDP"] = "true"
sdp = dist.new_group(backend="smddp")
os.environ.pop("SMDATAPARALLEL_OPTIMIZE_SDP")
chk = Checker(rank)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 12
ONLY = os.environ.get("SMDDP_TEST_CAPTURE_ONLY")
BIG = 4 << 20  # float32 elements: 16 MiB, the plan path


def full(n, value):
    return torch.full((n,), float(value), device=dev)


def collectives(n):
    """(name, call) pairs over n float32 elements per rank, with their expected results."""
    def allreduce():
        t = full(n, rank + 1)
        return lambda: dist.all_reduce(t), lambda: close(t, full(n, W * (W + 1) / 2))

    def allgather(group):
        def make():
            out = torch.empty(n * W, device=dev)
            inp = full(n, rank)
            want = torch.arange(W, device=dev, dtype=torch.float32).repeat_interleave(n)
            return lambda: dist.all_gather_into_tensor(out, inp, group=group), lambda: close(out, want)
        return make

    def reduce_scatter():
        inp = full(n * W, rank + 1)
        out = torch.empty(n, device=dev)
        return lambda: dist.reduce_scatter_tensor(out, inp), lambda: close(out, full(n, W * (W + 1) / 2))

    def broadcast():
        t = full(n, 7 if rank == 0 else -1)
        return lambda: dist.broadcast(t, 0), lambda: close(t, full(n, 7))

    def alltoall():
        inp = full(n * W, rank)
        out = torch.empty(n * W, device=dev)
        want = torch.arange(W, device=dev, dtype=torch.float32).repeat_interleave(n)
        return lambda: dist.all_to_all_single(out, inp), lambda: close(out, want)

    def barrier():
        return lambda: dist.barrier(), lambda: None

    return [("allreduce", allreduce), ("allgather", allgather(None)), ("allgather_sdp", allgather(sdp)),
            ("reduce_scatter", reduce_scatter), ("broadcast", broadcast), ("alltoall", alltoall)] + \
        ([("barrier", barrier)] if n == 8 else [])


def refused_when_captured(make, mode):
    call, check = make()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    err = None
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            call()
    except Exception as e:  # noqa: BLE001
        err = e
    if err is None:
        return "no error when captured"
    text = " ".join(str(x) for x in (err, err.__context__, err.__cause__) if x is not None)
    if "smddp" not in text or "CUDA graph" not in text or "nothing was sent" not in text:
        return "the error does not say why: %s: %s" % (type(err).__name__, text[:400])
    # Nothing was posted: the same call outside the capture is the group's next collective.
    call()
    torch.cuda.synchronize()
    return check()


for n in (8, BIG) if ONLY != "beside" else ():
    for name, make in collectives(n):
        for mode in ("global", "thread_local", "relaxed"):
            if n == BIG and mode != "global":
                continue
            chk.run("captured_%s_%d_%s_refused" % (name, n, mode), refused_when_captured, make, mode)


def capture_beside_collectives():
    """Frees the previous round's buffers (the peers close their mappings, with an event
    query first: on the progress thread, at the next plan), issues plan-path collectives on
    fresh buffers (the peers open them there) and small fast-path ones, then at once captures a
    graph of matmuls in global mode on a side stream, ROUNDS times; every result, and the
    graph's replay, must be right. capture_begin() directly: torch.cuda.graph() would first
    synchronize the device and collect garbage, and the progress thread's work would be over
    before the capture began."""
    a = torch.randn(256, 256, device=dev)
    b = torch.randn(256, 256, device=dev) / 16
    steps = 256
    eager = a
    for _ in range(steps):
        eager = torch.tanh(eager @ b)
    side = torch.cuda.Stream()
    done = 0
    pending = []
    for r in range(ROUNDS):
        pending = []  # the previous round's buffers are freed here
        torch.cuda.empty_cache()  # and their segments go back to CUDA: the peers unmap them
        for k in range(3):
            big = full(BIG + 4096 * (r * 3 + k), rank + 1)  # a new allocation each time
            pending.append((dist.all_reduce(big, async_op=True), big))
            small = full(8, rank + 1)
            pending.append((dist.all_reduce(small, async_op=True), small))
        big = small = None
        g = torch.cuda.CUDAGraph()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            g.capture_begin()  # capture_error_mode="global"
            x = a
            for _ in range(steps):
                x = torch.tanh(x @ b)
            g.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        g.replay()
        for work, _ in pending:
            work.wait()
        torch.cuda.synchronize()
        if (diff := close(x, eager, rtol=1e-4, atol=1e-5)) is not None:
            return "round %d: the graph's replay differs from eager: %s" % (r, diff)
        for i in range(len(pending)):
            t = pending[i][1]
            if (diff := close(t, full(t.numel(), W * (W + 1) / 2))) is not None:
                return "round %d: a collective issued before the capture: %s" % (r, diff)
        t = None
        done += 1
    return None if done == ROUNDS else "%d of %d rounds ran" % (done, ROUNDS)


if ONLY != "refusal":
    chk.run("capture_beside_collectives", capture_beside_collectives)
sys.exit(chk.finish())
