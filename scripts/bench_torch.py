#!/usr/bin/env python3
"""smddp vs NCCL through torch.distributed on the GPUs of one node, side by side.

    scripts/bench_torch.py [--build DIR] [--min 1K] [--max 1G] [--ops allreduce,allgather,reducescatter]
                           [--dtype float32] [--overlap] [--json FILE] [--launcher smddprun|torchrun]

Run as shown, it launches itself on every GPU (smddprun from --build, or torchrun). Inside a
launched job (RANK set) it benchmarks: for each size, latency, algbw and busbw (nccl-tests
conventions) of smddp and of NCCL and their ratio; with --overlap, a bf16 matmul loop on each
GPU while AllGathers run on another stream, and the matmul throughput each backend costs
(smddp through its SDP copy-engine path).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s):
    s = s.strip().upper().rstrip("B").rstrip("I")
    unit = s[-1] if s and s[-1] in UNITS else ""
    return int(float(s[:-1] if unit else s) * UNITS[unit])


def human(n):
    for u in ("G", "M", "K"):
        if n >= UNITS[u] and n % UNITS[u] == 0:
            return "%d%sB" % (n // UNITS[u], u)
    return "%dB" % n


def options(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=None, help="smddp build folder (default: newest build* beside the sources)")
    p.add_argument("--min", default="1K")
    p.add_argument("--max", default="1G")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--ops", default="allreduce,allgather,reducescatter")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--overlap", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--launcher", default="smddprun", choices=("smddprun", "torchrun"))
    p.add_argument("--nproc", type=int, default=0)
    return p.parse_args(argv)


def launch(opts, argv):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    build = opts.build
    if not build:
        cands = [os.path.join(root, d) for d in os.listdir(root) if d.startswith("build")]
        cands = [d for d in cands if os.path.exists(os.path.join(d, "bin", "smddprun"))]
        if not cands:
            sys.exit("bench_torch.py: no build with bin/smddprun found; pass --build")
        build = max(cands, key=os.path.getmtime)
    import torch
    nproc = opts.nproc or torch.cuda.device_count()
    if nproc < 2:
        sys.exit("bench_torch.py: needs 2 or more GPUs (found %d)" % nproc)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(build, "python")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("SMDDP_DAEMON", os.path.join(build, "bin", "smddp-daemon"))
    env.setdefault("SMDDP_BIN_DIR", os.path.join(build, "bin"))
    script = [sys.executable, os.path.abspath(__file__)] + argv
    if opts.launcher == "smddprun":
        cmd = [os.path.join(build, "bin", "smddprun"), "--nproc-per-node", str(nproc), "--"] + script
    else:
        torchrun = shutil.which("torchrun") or sys.exit("torchrun not found")
        cmd = [torchrun, "--standalone", "--nproc-per-node", str(nproc)] + script[1:]
    return subprocess.call(cmd, env=env)


def bench(opts):
    import torch
    import torch.distributed as dist
    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("smddp")
    rank, n = dist.get_rank(), dist.get_world_size()
    nccl = dist.new_group(backend="nccl")
    os.environ["SMDATAPARALLEL_OPTIMIZE_SDP"] = "true"
    sdp = dist.new_group(backend="smddp")
    os.environ.pop("SMDATAPARALLEL_OPTIMIZE_SDP")
    dtype = getattr(torch, opts.dtype)
    esize = torch.empty(0, dtype=dtype).element_size()

    def say(*a):
        if rank == 0:
            print(*a, flush=True)

    def make(op, size, group):
        """(callable, bytes the size stands for, busbw factor): nccl-tests conventions."""
        count = max(1, size // esize)
        if op == "allreduce":
            t = torch.ones(count, dtype=dtype, device=dev)
            return (lambda: dist.all_reduce(t, group=group)), count * esize, 2.0 * (n - 1) / n
        if op == "allgather":
            per = max(1, count // n)
            out = torch.empty(per * n, dtype=dtype, device=dev)
            inp = torch.ones(per, dtype=dtype, device=dev)
            return (lambda: dist.all_gather_into_tensor(out, inp, group=group)), per * n * esize, (n - 1) / n
        per = max(1, count // n)
        inp = torch.ones(per * n, dtype=dtype, device=dev)
        out = torch.empty(per, dtype=dtype, device=dev)
        return (lambda: dist.reduce_scatter_tensor(out, inp, group=group)), per * n * esize, (n - 1) / n

    def timed(fn, nbytes, group):
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        # About 0.2 s per point (5 to 200 iterations), agreed on by all ranks.
        est = torch.tensor([(time.perf_counter() - t0) / 3], device=dev, dtype=torch.float64)
        dist.all_reduce(est, op=dist.ReduceOp.MAX, group=nccl)
        iters = int(min(200, max(5, 0.2 / max(est.item(), 1e-6))))
        dist.barrier(group=nccl)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / iters
        # The slowest rank's time is the collective's time.
        t = torch.tensor([dt], device=dev, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=nccl)
        return t.item()

    sizes = []
    s = parse_size(opts.min)
    while s <= parse_size(opts.max):
        sizes.append(s)
        s *= opts.factor
    results = {"world_size": n, "dtype": opts.dtype, "gpu": torch.cuda.get_device_name(dev),
               "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())), "collectives": {}}
    for op in [o for o in opts.ops.split(",") if o]:
        say("\n# %s (%s, %d ranks)  sizes per nccl-tests: allgather/reducescatter = whole buffer" % (op, opts.dtype, n))
        say("%10s  %12s %9s %9s  %12s %9s %9s  %8s %8s" % ("size", "smddp us", "algbw", "busbw", "nccl us",
                                                          "algbw", "busbw", "lat x", "busbw x"))
        rows = []
        for size in sizes:
            row = {"size": size}
            for name, group in (("smddp", sdp if op == "allgather" else None), ("nccl", nccl)):
                fn, nbytes, factor = make(op, size, group)
                dt = timed(fn, nbytes, group)
                row[name] = {"latency_us": dt * 1e6, "algbw_gbps": nbytes / dt / 1e9, "busbw_gbps": nbytes / dt / 1e9 * factor}
                del fn
            row["latency_ratio"] = row["nccl"]["latency_us"] / row["smddp"]["latency_us"]
            row["busbw_ratio"] = row["smddp"]["busbw_gbps"] / row["nccl"]["busbw_gbps"]
            rows.append(row)
            a, b = row["smddp"], row["nccl"]
            say("%10s  %12.1f %9.2f %9.2f  %12.1f %9.2f %9.2f  %8.2f %8.2f" % (
                human(size), a["latency_us"], a["algbw_gbps"], a["busbw_gbps"], b["latency_us"], b["algbw_gbps"],
                b["busbw_gbps"], row["latency_ratio"], row["busbw_ratio"]))
            torch.cuda.empty_cache()
        results["collectives"][op] = rows
    say("\n(lat x = nccl latency / smddp latency; busbw x = smddp busbw / nccl busbw; > 1 means smddp is faster)")

    if opts.overlap:
        results["overlap"] = overlap(dist, torch, dev, sdp, nccl, n, say)
    if rank == 0:
        # The daemon's view: kernel launches per operation (SDP AllGather: copy engines only).
        from smdistributed.dataparallel.torch import _smddp_c
        ctl = os.path.join(os.environ.get("SMDDP_BIN_DIR", ""), "smddp-ctl")
        job = (_smddp_c.client_info() or {}).get("job_id", "")
        if os.access(ctl, os.X_OK) and job:
            st = subprocess.run([ctl, "status", "--job", job], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=30).stdout
            say("\n# smddp-ctl status --job %s\n%s" % (job, st))
            results["smddp_ctl_status"] = st
    if rank == 0 and opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier(group=nccl)
    dist.destroy_process_group()
    return 0


def overlap(dist, torch, dev, sdp, nccl, n, say):
    """bf16 matmuls on the default stream while 256 MiB AllGathers run on a side stream."""
    m = 8192
    a = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    per = (256 << 20) // 2 // n
    inp = torch.ones(per, device=dev, dtype=torch.bfloat16)
    out = torch.empty(per * n, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream(device=dev)
    flop = 2.0 * m * m * m

    def matmuls(k):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(k):
            torch.mm(a, b)
        end.record()
        return start, end

    k = 200
    for _ in range(5):
        torch.mm(a, b)
    torch.cuda.synchronize()
    s, e = matmuls(k)
    torch.cuda.synchronize()
    alone_ms = s.elapsed_time(e)
    res = {"matmul_alone_tflops": flop * k / alone_ms / 1e9}
    for name, group in (("smddp_sdp", sdp), ("nccl", nccl)):
        # As many AllGathers as take about as long as the matmuls alone.
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                dist.all_gather_into_tensor(out, inp, group=group)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(side):
            for _ in range(10):
                dist.all_gather_into_tensor(out, inp, group=group)
        torch.cuda.synchronize()
        ag_ms = (time.perf_counter() - t0) * 100
        # Every rank must issue the same number of AllGathers: agree on the smallest count.
        agreed = torch.tensor([max(1, int(alone_ms / ag_ms))], device=dev, dtype=torch.int64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=nccl)
        reps = int(agreed.item())
        dist.barrier(group=nccl)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            works = [dist.all_gather_into_tensor(out, inp, group=group, async_op=True) for _ in range(reps)]
        s, e = matmuls(k)
        for w in works:
            w.wait()
        torch.cuda.synchronize()
        ms = s.elapsed_time(e)
        res[name] = {"matmul_tflops": flop * k / ms / 1e9, "throughput_lost": 1.0 - alone_ms / ms,
                     "allgathers": reps, "allgather_ms": ag_ms}
    say("\n# overlap: %d bf16 %dx%d matmuls, 256 MiB AllGathers on a side stream" % (k, m, m))
    say("matmul alone: %.1f TFLOP/s" % res["matmul_alone_tflops"])
    for name in ("smddp_sdp", "nccl"):
        r = res[name]
        say("%-10s matmul %.1f TFLOP/s, throughput lost %.1f%% (%d AllGathers of %.2f ms)" % (
            name, r["matmul_tflops"], 100 * r["throughput_lost"], r["allgathers"], r["allgather_ms"]))
    lost_nccl = res["nccl"]["throughput_lost"]
    if lost_nccl > 0:
        say("smddp loses %.2fx of what nccl loses" % (res["smddp_sdp"]["throughput_lost"] / lost_nccl))
    return res


def main():
    argv = sys.argv[1:]
    opts = options(argv)
    if "RANK" not in os.environ:
        return launch(opts, argv)
    return bench(opts)


if __name__ == "__main__":
    sys.exit(main())
