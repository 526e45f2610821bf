"""all_reduce of CUDA tensors across 2 simulated nodes: us per op and rank 0's CPU time (all its
threads) per op, synchronous and asynchronous (4 in flight, then waited), beside host tensors.

    PYTHONPATH=build/python build/bin/smddprun --simulate-nodes 2 --nproc-per-node 1 -- \
        python3 scripts/diag/staged_latency.py

Environment: SIZES (bytes, comma-separated), MODES (sync,async), ITERS, CAP_BYTES (bytes moved
per size at most), MIXED=1 (only rank 0 on CUDA tensors: one context on a shared GPU),
SKIP_CPU=1 (no host-tensor rows). scripts/diag/ab_report.py summarizes old/new rounds."""
import os
import time

import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401

rank = int(os.environ["RANK"])
torch.cuda.set_device(rank % torch.cuda.device_count())
dist.init_process_group("smddp")
mixed = os.environ.get("MIXED") == "1"
sizes = [int(x) for x in os.environ.get("SIZES", "8,32768,131072,1048576,4194304,67108864").split(",")]
for mode in os.environ.get("MODES", "sync,async").split(","):
    for size in sizes:
        for dev in ("cuda", "cpu"):
            if dev == "cpu" and (mode == "async" or os.environ.get("SKIP_CPU") == "1"):
                continue
            cap = int(os.environ.get("CAP_BYTES", str(256 << 20)))
            iters = max(8, min(int(os.environ.get("ITERS", "400")), cap // max(size, 1)))
            iters -= iters % 4
            n = max(1, size // 4)
            mine = "cpu" if mixed and rank != 0 else dev
            t = [torch.ones(n, device=mine) for _ in range(4)]
            if mode == "sync":
                def fn():
                    dist.all_reduce(t[0])
            else:
                def fn():
                    ws = [dist.all_reduce(x, async_op=True) for x in t]
                    for w in ws:
                        w.wait()
            reps = iters if mode == "sync" else iters // 4
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            dist.barrier()
            c0 = time.process_time_ns()
            t0 = time.monotonic_ns()
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
            t1 = time.monotonic_ns()
            c1 = time.process_time_ns()
            if rank == 0:
                print("%s %9d %s %9.1f us/op  cpu %9.1f us/op  (%.2f cores)" % (
                    mode, size, dev, (t1 - t0) / iters / 1e3, (c1 - c0) / iters / 1e3, (c1 - c0) / (t1 - t0)), flush=True)
dist.destroy_process_group()
