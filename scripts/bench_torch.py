#!/usr/bin/env python3
"""smddp vs NCCL through torch.distributed on the GPUs of one node, side by side.

    scripts/bench_torch.py [--build DIR] [--min 1K] [--max 1G] [--factor 4]
                           [--ops allreduce,allgather,allgather_kernel,reducescatter]
                           [--dtype float32] [--overlap] [--json FILE] [--launcher smddprun|torchrun]
                           [--nproc N] [--simulate-nodes K]

Run as shown, it launches itself on every GPU (smddprun from --build, or torchrun). Inside a
launched job (RANK set) it benchmarks: for each size, latency, algbw and busbw (nccl-tests
conventions) of smddp and of NCCL and their ratio. `allgather` times smddp through its SDP group
(copy engines), `allgather_kernel` through the default (world) group, where AllGather may launch
kernels. With --overlap, a bf16 matmul loop on each GPU while AllGathers run on another stream,
and the matmul throughput each backend costs (smddp through its SDP copy-engine path): once with
as many AllGathers as fit each backend's own AllGather time, once with equal work for both;
all of it out of place, then in place (FSDP's form: no local copy).

With --simulate-nodes K (smddprun only) the ranks are split into K simulated nodes, one GPU per
rank (GPU RANK modulo the GPUs: on a one-GPU machine, `--nproc 2` puts both ranks on it, and the
ranks agree on timings through Gloo); smddp's CUDA tensors then cross the daemons' fabric through host staging, so NCCL (NVLink)
is no fair reference: the columns are smddp with CUDA tensors and smddp with CPU tensors.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
OPS = ("allreduce", "allgather", "allgather_kernel", "reducescatter")


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
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated, of: %s" % ", ".join(OPS))
    p.add_argument("--dtype", default="float32")
    p.add_argument("--overlap", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--launcher", default="smddprun", choices=("smddprun", "torchrun"))
    p.add_argument("--nproc", type=int, default=0)
    p.add_argument("--simulate-nodes", type=int, default=0, metavar="K",
                   help="split the ranks into K simulated nodes (smddprun only); compares smddp CUDA vs CPU tensors")
    opts = p.parse_args(argv)
    # Checked here, before launching: an unknown op would otherwise fail on every rank.
    unknown = [o for o in opts.ops.split(",") if o and o not in OPS]
    if unknown:
        p.error("unknown op(s) %s; known: %s" % (",".join(unknown), ",".join(OPS)))
    if opts.simulate_nodes < 0 or opts.simulate_nodes == 1:
        p.error("--simulate-nodes K needs K >= 2 (0 = off)")
    if opts.simulate_nodes and opts.launcher != "smddprun":
        p.error("--simulate-nodes needs --launcher smddprun (torchrun cannot simulate nodes)")
    return opts


def find_build(build, who):
    """The build folder to run: `build`, else the newest build* beside the sources with smddprun."""
    if build:
        return os.path.abspath(build)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cands = [os.path.join(root, d) for d in os.listdir(root) if d.startswith("build")]
    cands = [d for d in cands if os.path.exists(os.path.join(d, "bin", "smddprun"))]
    if not cands:
        sys.exit("%s: no build with bin/smddprun found; pass --build" % who)
    return max(cands, key=os.path.getmtime)


def build_env(build):
    """The environment for ranks of `build`: its Python package, daemon and binaries."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(build, "python")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["SMDDP_DAEMON"] = os.path.join(build, "bin", "smddp-daemon")  # the build asked for, not one set before
    env["SMDDP_BIN_DIR"] = os.path.join(build, "bin")
    return env


def launch(opts, argv):
    build = find_build(opts.build, "bench_torch.py")
    import torch
    nproc = opts.nproc or torch.cuda.device_count()
    if nproc < 2:
        sys.exit("bench_torch.py: needs 2 or more GPUs (found %d)" % nproc)
    k = opts.simulate_nodes
    if k and nproc % k:
        sys.exit("bench_torch.py: --simulate-nodes %d needs a rank count divisible by %d (have %d; set --nproc)"
                 % (k, k, nproc))
    env = build_env(build)
    script = [sys.executable, os.path.abspath(__file__)] + argv
    if opts.launcher == "smddprun" and k:
        # Every simulated node has local rank 0 only: pick GPUs by global rank instead.
        env["SMDDP_BENCH_GPU_BY_RANK"] = "1"
        cmd = [os.path.join(build, "bin", "smddprun"), "--simulate-nodes", str(k),
               "--nproc-per-node", str(nproc // k), "--"] + script
    elif opts.launcher == "smddprun":
        cmd = [os.path.join(build, "bin", "smddprun"), "--nproc-per-node", str(nproc), "--"] + script
    else:
        torchrun = shutil.which("torchrun") or sys.exit("torchrun not found")
        cmd = [torchrun, "--standalone", "--nproc-per-node", str(nproc)] + script[1:]
    return subprocess.call(cmd, env=env)


def gpu_index(torch):
    """This rank's GPU: LOCAL_RANK, or RANK modulo the GPUs when nodes are simulated."""
    if os.environ.get("SMDDP_BENCH_GPU_BY_RANK") == "1":
        return int(os.environ["RANK"]) % torch.cuda.device_count()
    return int(os.environ.get("LOCAL_RANK", "0"))


def bench(opts):
    import torch
    import torch.distributed as dist
    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401

    local = gpu_index(torch)
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    host = torch.device("cpu")
    sim = opts.simulate_nodes > 0
    dist.init_process_group("smddp")
    rank, n = dist.get_rank(), dist.get_world_size()
    # NCCL works on one machine whatever the simulated split: it stays the group ranks agree through,
    # unless the ranks share a GPU (simulated nodes on a one-GPU machine), which NCCL refuses: Gloo then.
    shared_gpu = sim and torch.cuda.device_count() < n
    nccl = dist.new_group(backend="gloo" if shared_gpu else "nccl")
    agree = host if shared_gpu else dev  # where the agreement group's tensors live
    sdp = None
    if not sim:
        # The SDP group (AllGather through copy engines) is a one-node path; across nodes it adds nothing.
        os.environ["SMDATAPARALLEL_OPTIMIZE_SDP"] = "true"
        sdp = dist.new_group(backend="smddp")
        os.environ.pop("SMDATAPARALLEL_OPTIMIZE_SDP")
    dtype = getattr(torch, opts.dtype)
    esize = torch.empty(0, dtype=dtype).element_size()

    def say(*a):
        if rank == 0:
            print(*a, flush=True)

    def make(op, size, group, device):
        """(callable, bytes the size stands for, busbw factor): nccl-tests conventions."""
        count = max(1, size // esize)
        if op == "allreduce":
            t = torch.ones(count, dtype=dtype, device=device)
            return (lambda: dist.all_reduce(t, group=group)), count * esize, 2.0 * (n - 1) / n
        if op in ("allgather", "allgather_kernel"):
            per = max(1, count // n)
            out = torch.empty(per * n, dtype=dtype, device=device)
            inp = torch.ones(per, dtype=dtype, device=device)
            return (lambda: dist.all_gather_into_tensor(out, inp, group=group)), per * n * esize, (n - 1) / n
        if op == "reducescatter":
            per = max(1, count // n)
            inp = torch.ones(per * n, dtype=dtype, device=device)
            out = torch.empty(per, dtype=dtype, device=device)
            return (lambda: dist.reduce_scatter_tensor(out, inp, group=group)), per * n * esize, (n - 1) / n
        raise ValueError("unknown op " + op)

    def columns(op):
        """The two (JSON name, group, tensor device) compared: the first column is divided by the second."""
        if sim:
            # Across nodes NCCL's NVLink is no fair reference; CPU tensors take the host path on the same fabric.
            return (("smddp_cuda", None, dev), ("smddp_host", None, host))
        return (("smddp", sdp if op == "allgather" else None, dev), ("nccl", nccl, dev))

    def timed(fn, nbytes, group):
        # The synchronize calls are no-ops for CPU tensors, whose collectives return when done.
        # Untimed first: the first use of new tensors opens their buffers in the peers (tens of
        # ms), which would also inflate the estimate below and so leave too few iterations.
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        # About 0.2 s per point (5 to 200 iterations), agreed on by all ranks.
        est = torch.tensor([(time.perf_counter() - t0) / 3], device=agree, dtype=torch.float64)
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
        t = torch.tensor([dt], device=agree, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=nccl)
        return t.item()

    sizes = []
    s = parse_size(opts.min)
    while s <= parse_size(opts.max):
        sizes.append(s)
        s *= opts.factor
    results = {"world_size": n, "dtype": opts.dtype, "gpu": torch.cuda.get_device_name(dev),
               "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
               "simulate_nodes": opts.simulate_nodes, "collectives": {}}
    if sim:
        say("# simulated nodes: %d nodes x %d ranks. The world group spans nodes, so smddp's CUDA tensors go through"
            " host staging and the daemons' fabric; NCCL (NVLink) is no fair reference. Columns: smddp with CUDA"
            " tensors (cuda) vs smddp with CPU tensors of the same size (host)." % (opts.simulate_nodes, n // opts.simulate_nodes))
    head_a, head_b = ("cuda us", "host us") if sim else ("smddp us", "nccl us")
    for op in [o for o in opts.ops.split(",") if o]:
        say("\n# %s (%s, %d ranks)  sizes per nccl-tests: allgather/reducescatter = whole buffer" % (op, opts.dtype, n))
        say("%10s  %12s %9s %9s  %12s %9s %9s  %8s %8s" % ("size", head_a, "algbw", "busbw", head_b,
                                                          "algbw", "busbw", "lat x", "busbw x"))
        (name_a, _, _), (name_b, _, _) = columns(op)
        rows = []
        for size in sizes:
            row = {"size": size}
            for name, group, device in columns(op):
                fn, nbytes, factor = make(op, size, group, device)
                dt = timed(fn, nbytes, group)
                row[name] = {"latency_us": dt * 1e6, "algbw_gbps": nbytes / dt / 1e9, "busbw_gbps": nbytes / dt / 1e9 * factor}
                del fn
            row["latency_ratio"] = row[name_b]["latency_us"] / row[name_a]["latency_us"]
            row["busbw_ratio"] = row[name_a]["busbw_gbps"] / row[name_b]["busbw_gbps"]
            rows.append(row)
            a, b = row[name_a], row[name_b]
            say("%10s  %12.1f %9.2f %9.2f  %12.1f %9.2f %9.2f  %8.2f %8.2f" % (
                human(size), a["latency_us"], a["algbw_gbps"], a["busbw_gbps"], b["latency_us"], b["algbw_gbps"],
                b["busbw_gbps"], row["latency_ratio"], row["busbw_ratio"]))
            torch.cuda.empty_cache()
        results["collectives"][op] = rows
    if sim:
        say("\n(lat x = host latency / cuda latency; busbw x = cuda busbw / host busbw; > 1 means CUDA tensors are faster)")
    else:
        say("\n(lat x = nccl latency / smddp latency; busbw x = smddp busbw / nccl busbw; > 1 means smddp is faster)")

    if opts.overlap and sim:
        say("\n# overlap skipped with --simulate-nodes (it compares smddp's SDP path with NCCL on one node)")
    elif opts.overlap:
        results["overlap"] = overlap(dist, torch, dev, sdp, nccl, n, say)
        # FSDP's form: each rank's input is its block of the output, so nothing moves locally.
        results["overlap_inplace"] = overlap(dist, torch, dev, sdp, nccl, n, say, inplace=True)
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


def overlap(dist, torch, dev, sdp, nccl, n, say, runs=3, inplace=False):
    """bf16 matmuls on the default stream while 256 MiB AllGathers run on a side stream.

    Out of place (the default) each rank also copies its own input into its block of the
    output; `inplace` (FSDP's form) the input is that block, so only the others' blocks move.

    Back-to-back: each backend runs as many AllGathers as its own AllGather time fits into the
    matmul window (the faster backend runs more). Equal work: both run the smaller of the two
    counts. Each is measured `runs` times, backends alternating, and the median kept.
    """
    m = 8192
    a = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    per = (256 << 20) // 2 // n
    out = torch.empty(per * n, device=dev, dtype=torch.bfloat16)
    rank = dist.get_rank()
    inp = out[rank * per:(rank + 1) * per] if inplace else torch.ones(per, device=dev, dtype=torch.bfloat16)
    if inplace:
        inp.fill_(1)
    side = torch.cuda.Stream(device=dev)
    flop = 2.0 * m * m * m
    k = 200
    groups = (("smddp_sdp", sdp), ("nccl", nccl))

    def matmuls(k):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(k):
            torch.mm(a, b)
        end.record()
        return start, end

    def agree_min(v):
        # Every rank must issue the same number of AllGathers: agree on the smallest count.
        t = torch.tensor([v], device=dev, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=nccl)
        return int(t.item())

    def allgather_ms(group):
        """One 256 MiB AllGather's time, back to back on the side stream."""
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
        return (time.perf_counter() - t0) * 100

    def window(group, reps):
        """Milliseconds of k matmuls while `reps` AllGathers run beside them (0: matmuls alone)."""
        dist.barrier(group=nccl)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            works = [dist.all_gather_into_tensor(out, inp, group=group, async_op=True) for _ in range(reps)]
        s, e = matmuls(k)
        for w in works:
            w.wait()
        torch.cuda.synchronize()
        return s.elapsed_time(e)

    for _ in range(5):
        torch.mm(a, b)
    torch.cuda.synchronize()
    first_alone_ms = window(None, 0)
    ag_ms = {name: allgather_ms(group) for name, group in groups}
    # As many AllGathers as take about as long as the matmuls alone.
    reps = {name: agree_min(max(1, int(first_alone_ms / ag_ms[name]))) for name, _ in groups}
    equal = agree_min(min(reps.values()))  # equal on every rank already; agreeing costs nothing
    alone, b2b, eq = [], {name: [] for name, _ in groups}, {name: [] for name, _ in groups}
    for _ in range(runs):
        # Alternating backends spreads clock and thermal drift over both.
        alone.append(window(None, 0))
        for name, group in groups:
            b2b[name].append(window(group, reps[name]))
        for name, group in groups:
            eq[name].append(window(group, equal))
    alone_ms = statistics.median(alone)

    def summary(windows):
        """Median matmul TFLOP/s and throughput lost (one run: both medians), and every run."""
        rs = [{"matmul_tflops": flop * k / ms / 1e9, "throughput_lost": 1.0 - alone_ms / ms} for ms in windows]
        return {"matmul_tflops": statistics.median(r["matmul_tflops"] for r in rs),
                "throughput_lost": statistics.median(r["throughput_lost"] for r in rs), "runs": rs}

    def ratio(x, y):
        return x / y if y > 0 else None

    res = {"inplace": inplace, "matmul_alone_tflops": flop * k / alone_ms / 1e9, "repeats": runs,
           "matmul_alone_runs_tflops": [flop * k / ms / 1e9 for ms in alone]}
    for name, _ in groups:
        res[name] = dict(summary(b2b[name]), allgathers=reps[name], allgather_ms=ag_ms[name])
    res["equal_work"] = {"allgathers": equal, **{name: summary(eq[name]) for name, _ in groups}}
    res["equal_work"]["ratio"] = ratio(res["equal_work"]["smddp_sdp"]["throughput_lost"],
                                       res["equal_work"]["nccl"]["throughput_lost"])

    say("\n# overlap: %d bf16 %dx%d matmuls, 256 MiB AllGathers on a side stream, %s" % (
        k, m, m, "in place (the input is the rank's block of the output, as FSDP calls it)" if inplace else "out of place"))
    say("(median of %d runs each, backends alternating; back to back: as many AllGathers as fit each backend's own"
        " AllGather time)" % runs)
    say("matmul alone: %.1f TFLOP/s" % res["matmul_alone_tflops"])
    for name, _ in groups:
        r = res[name]
        say("%-10s matmul %.1f TFLOP/s, throughput lost %.1f%% (%d AllGathers of %.2f ms)" % (
            name, r["matmul_tflops"], 100 * r["throughput_lost"], r["allgathers"], r["allgather_ms"]))
    lost_nccl = res["nccl"]["throughput_lost"]
    if lost_nccl > 0:
        say("smddp loses %.2fx of what nccl loses" % (res["smddp_sdp"]["throughput_lost"] / lost_nccl))
    label = "equal work (%d AllGathers each)" % equal
    for name, _ in groups:
        r = res["equal_work"][name]
        say("%s %-10s matmul %.1f TFLOP/s, throughput lost %.1f%% (runs: %s)" % (
            label, name, r["matmul_tflops"], 100 * r["throughput_lost"],
            " ".join("%.1f%%" % (100 * x["throughput_lost"]) for x in r["runs"])))
    if res["equal_work"]["ratio"] is not None:
        say("%s smddp loses %.2fx of what nccl loses" % (label, res["equal_work"]["ratio"]))
    return res


def main():
    argv = sys.argv[1:]
    opts = options(argv)
    if "RANK" not in os.environ:
        return launch(opts, argv)
    return bench(opts)


if __name__ == "__main__":
    sys.exit(main())
