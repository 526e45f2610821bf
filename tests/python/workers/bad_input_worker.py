"""Bad input raises an SMDDPError subclass that says what and why, at once, and the group
stays usable afterwards (each case is followed by a correct allreduce)."""

import torch
import torch.distributed as dist

from smdistributed.dataparallel import exceptions as E
from common import Checker, init

rank, W = init()
chk = Checker(rank)


def still_usable():
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    want = float(sum(range(1, W + 1)))
    if not bool((t == want).all()):
        return "allreduce after the error gave %s, expected %s" % (t.tolist(), want)


def case(name, exc, fn, contains=None):
    chk.expect("bad." + name, exc, fn, contains=contains)
    chk.run("usable_after." + name, still_usable)


case("non_contiguous", E.SMDDPInvalidArgumentError,
     lambda: dist.all_reduce(torch.zeros(4, 4).t()), contains="not contiguous")
case("unsupported_dtype_int16", E.SMDDPUnsupportedError,
     lambda: dist.broadcast(torch.zeros(4, dtype=torch.int16), src=0), contains="Short")
case("avg_on_int", E.SMDDPUnsupportedError,
     lambda: dist.all_reduce(torch.zeros(4, dtype=torch.int32), op=dist.ReduceOp.AVG), contains="AVG")
case("band_on_float", E.SMDDPUnsupportedError,
     lambda: dist.all_reduce(torch.zeros(4), op=dist.ReduceOp.BAND), contains="BAND")
case("allgather_list_length", E.SMDDPInvalidArgumentError,
     lambda: dist.all_gather([torch.zeros(4)] * (W + 1), torch.zeros(4)), contains="one per rank")
case("allgather_output_size", E.SMDDPInvalidArgumentError,
     lambda: dist.all_gather_into_tensor(torch.zeros(W * 4 + 1), torch.zeros(4)), contains="elements")
case("allgather_output_numel", E.SMDDPInvalidArgumentError,
     lambda: dist.all_gather([torch.zeros(5) for _ in range(W)], torch.zeros(4)), contains="elements")
case("reduce_scatter_size", E.SMDDPInvalidArgumentError,
     lambda: dist.reduce_scatter_tensor(torch.zeros(3), torch.zeros(W * 4)), contains="elements")
case("alltoall_splits", E.SMDDPInvalidArgumentError,
     lambda: dist.all_to_all_single(torch.zeros(W * 2), torch.zeros(W * 2),
                                    input_split_sizes=[1] * W, output_split_sizes=[2] * W), contains="split")
case("broadcast_root", E.SMDDPInvalidArgumentError,
     lambda: dist.broadcast(torch.zeros(4), src=W + 3), contains="root rank")
# Through the process group itself: torch 2.x's dist.send() rejects dst == rank in Python
# (ValueError) before any backend sees it; the backend must still refuse it on its own.
case("send_to_self", E.SMDDPInvalidArgumentError, lambda: dist.group.WORLD.send([torch.zeros(4)], rank, 0).wait(),
     contains="itself")
case("recv_any_source", E.SMDDPUnsupportedError, lambda: dist.recv(torch.zeros(4)), contains="any source")
# One call, tensors on two devices: cpu and cuda where there is a GPU; without one, the meta
# device, which smddp refuses as such.
if torch.cuda.is_available():
    case("two_devices", E.SMDDPInvalidArgumentError,
         lambda: dist.all_gather([torch.zeros(4) for _ in range(W - 1)] + [torch.zeros(4, device="cuda")],
                                 torch.zeros(4)), contains="different devices")
else:
    case("two_devices", E.SMDDPUnsupportedError,
         lambda: dist.all_gather([torch.zeros(4) for _ in range(W - 1)] + [torch.zeros(4, device="meta")],
                                 torch.zeros(4)), contains="device meta")


# Sizes that differ between ranks: only the daemon can see it; every rank gets the mismatch.
def mismatched_sizes():
    dist.all_reduce(torch.zeros(4 + rank))


# The message names every rank's call (daemon/matcher.cpp describe_call).
case("size_mismatch_across_ranks", E.SMDDPMismatchError, mismatched_sizes,
     contains=["rank %d called allreduce(float32, count=%d," % (r, 4 + r) for r in range(W)])


def mismatched_ops():
    if rank == 0:
        dist.all_reduce(torch.zeros(4))
    else:
        dist.broadcast(torch.zeros(4), src=0)


case("op_mismatch_across_ranks", E.SMDDPMismatchError, mismatched_ops,
     contains=["rank 0 called allreduce(float32, count=4,"] +
              ["rank %d called broadcast(float32, count=4, root=0)" % r for r in range(1, W)])

# Complex tensors reach smddp as real views (torch does that for SUM): they must work.
def complex_sum():
    t = torch.full((3,), complex(rank, 1), dtype=torch.complex64)
    dist.all_reduce(t)
    want = torch.full((3,), complex(sum(range(W)), W), dtype=torch.complex64)
    return None if torch.equal(t, want) else "complex sum gave %s" % t.tolist()


chk.run("complex_sum_via_real_view", complex_sum)

# Every error is also a RuntimeError (what other backends raise).
chk.run("errors_are_runtime_errors", lambda: None if issubclass(E.SMDDPInvalidArgumentError, RuntimeError) else "no")

dist.barrier()
dist.destroy_process_group()
raise SystemExit(chk.finish())
