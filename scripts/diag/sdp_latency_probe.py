"""Where a small SDP AllGather's time goes, beside the kernel AllGather and NCCL (run under
smddprun with 2 ranks, on the GPU machine):

    smddprun --nproc-per-node 2 -- python3 scripts/diag/sdp_latency_probe.py [ITERS]

For each size and form (out of place, and in place as FSDP calls it), a loop of synchronous
all_gather_into_tensor calls: the time per op, and the CPU time spent inside the calls. When
the two are equal the loop is bound by the CPU that issues it; when the op takes longer than
its calls, by the GPU work that the ranks' flags chain together. Rank 0 prints 'SDP' lines.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("smddp")
    rank, n = dist.get_rank(), dist.get_world_size()
    nccl = dist.new_group(backend="nccl")
    os.environ["SMDATAPARALLEL_OPTIMIZE_SDP"] = "true"
    sdp = dist.new_group(backend="smddp")
    os.environ.pop("SMDATAPARALLEL_OPTIMIZE_SDP")
    groups = (("sdp", sdp), ("kernel", None), ("nccl", nccl))
    for count in (2, 256, 16384, 131072):  # float32: 8 B to 512 KiB per rank
        for inplace in (False, True):
            out = torch.zeros(count * n, device=dev)
            inp = out[rank * count:(rank + 1) * count] if inplace else torch.ones(count, device=dev)
            for name, group in groups:
                for _ in range(20):
                    dist.all_gather_into_tensor(out, inp, group=group)
                dist.barrier(group=nccl)
                torch.cuda.synchronize()
                inside = 0.0
                t0 = time.perf_counter()
                for _ in range(iters):
                    c0 = time.perf_counter()
                    dist.all_gather_into_tensor(out, inp, group=group)
                    inside += time.perf_counter() - c0
                torch.cuda.synchronize()
                total = time.perf_counter() - t0
                t = torch.tensor([total / iters * 1e6, inside / iters * 1e6], device=dev, dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=nccl)
                if rank == 0:
                    print("SDP %-7s %-11s %7d B per rank: %6.1f us per op, %6.1f us in the call (slowest rank)" % (
                        name, "in place" if inplace else "out of place", count * 4, t[0].item(), t[1].item()),
                        flush=True)
    dist.barrier(group=nccl)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
