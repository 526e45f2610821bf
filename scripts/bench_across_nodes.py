#!/usr/bin/env python3
"""CUDA tensors across simulated nodes: smddp's hierarchical path beside its staged path, side by side in
one job, nccl-tests-style algbw and busbw per size.

    scripts/bench_across_nodes.py [--build DIR] [--nodes 2] [--nproc-per-node 2] [--min 1M] [--max 256M]
                                  [--factor 4] [--ops allreduce,allgather,reducescatter,broadcast]
                                  [--dtype float32] [--paths hierarchical,staged] [--json FILE]
                                  [--set SECTION.KEY=VALUE ...] [--mps]

Run as shown, it launches itself through `smddprun --simulate-nodes NODES` from --build, every rank on
GPU RANK modulo the GPUs (one GPU is enough: the ranks of a node reach each other through CUDA IPC
on it, and the nodes' daemons talk over loopback). Ranks that share a GPU run in time slices, and every
wait of one rank's GPU on another's (the hierarchical path's in-node barriers) costs a slice, which
GPUs of their own do not pay; --mps runs the job under a CUDA MPS control daemon of its own (its own
pipe and log folders, quit at the end), so that the ranks' kernels run side by side as on a node. Each path is a process group made with
SMDDP_CUDA_ACROSS_NODES set to it (a build that does not know the setting runs its only path in
every column). Timings are agreed through a Gloo group (ranks that share a GPU cannot form an NCCL
one). After the sweep, rank 0 measures what crossed PCIe per rank and operation (`smddp-ctl status
--json`: the bytes each rank copied device-to-host and host-to-device) for a few operations of
the largest size on each path.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch import build_env, find_build, human, parse_size  # noqa: E402 - beside this script

OPS = ("allreduce", "allgather", "reducescatter", "broadcast")


def options(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=None, help="smddp build folder (default: newest build* beside the sources)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--nproc-per-node", type=int, default=2)
    p.add_argument("--min", default="1M")
    p.add_argument("--max", default="256M")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtype", default="float32")
    p.add_argument("--paths", default="hierarchical,staged")
    p.add_argument("--json", default=None)
    p.add_argument("--set", action="append", default=[], help="passed to smddprun (daemon configuration)")
    p.add_argument("--mps", action="store_true", help="run the ranks under a private CUDA MPS daemon")
    opts = p.parse_args(argv)
    bad = [o for o in opts.ops.split(",") if o not in OPS]
    if bad:
        p.error("unknown op(s) %s; known: %s" % (",".join(bad), ",".join(OPS)))
    bad = [x for x in opts.paths.split(",") if x not in ("hierarchical", "staged")]
    if bad:
        p.error("unknown path(s) %s: hierarchical, staged" % ",".join(bad))
    if opts.nodes < 2 or opts.nproc_per_node < 1:
        p.error("--nodes needs 2 or more, --nproc-per-node 1 or more")
    return opts


def launch(opts, argv):
    build = find_build(opts.build, "bench_across_nodes.py")
    env = build_env(build)
    cmd = [os.path.join(build, "bin", "smddprun"), "--simulate-nodes", str(opts.nodes),
           "--nproc-per-node", str(opts.nproc_per_node)]
    for s in opts.set:
        cmd += ["--set", s]
    cmd += ["--", sys.executable, os.path.abspath(__file__)] + argv
    if not opts.mps:
        return subprocess.call(cmd, env=env)
    with PrivateMps() as mps_env:
        env.update(mps_env)
        return subprocess.call(cmd, env=env)


class PrivateMps:
    """A CUDA MPS control daemon for this run only: its pipe and log folders are private, so no other
    process on the machine becomes its client, and it is told to quit when the run ends."""

    def __init__(self):
        self.ctl = shutil.which("nvidia-cuda-mps-control")
        if not self.ctl:
            sys.exit("bench_across_nodes.py --mps: nvidia-cuda-mps-control is not on PATH")
        self.dir = tempfile.mkdtemp(prefix="smddp-mps-")
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(self.dir, "pipe"),
                    "CUDA_MPS_LOG_DIRECTORY": os.path.join(self.dir, "log")}

    def __enter__(self):
        for d in self.env.values():
            os.makedirs(d)
        r = subprocess.run([self.ctl, "-d"], env=dict(os.environ, **self.env), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=30)
        if r.returncode != 0:
            sys.exit("bench_across_nodes.py --mps: nvidia-cuda-mps-control -d failed: " + r.stdout)
        print("# ranks under a private CUDA MPS daemon (%s)" % self.env["CUDA_MPS_PIPE_DIRECTORY"], flush=True)
        return self.env

    def __exit__(self, *exc):
        subprocess.run([self.ctl], input="quit\n", env=dict(os.environ, **self.env), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, text=True, timeout=30)
        # The control daemon removes its pipe when it has quit.
        deadline = time.time() + 10
        while os.path.exists(os.path.join(self.env["CUDA_MPS_PIPE_DIRECTORY"], "control")) and time.time() < deadline:
            time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)
        return False


def bench(opts):
    import torch
    import torch.distributed as dist
    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401

    local = int(os.environ["RANK"]) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("smddp")
    rank, n = dist.get_rank(), dist.get_world_size()
    agree = dist.new_group(backend="gloo")
    groups = {}
    for path in opts.paths.split(","):
        os.environ["SMDDP_CUDA_ACROSS_NODES"] = path  # read when the group is made
        groups[path] = dist.new_group(backend="smddp")
    os.environ.pop("SMDDP_CUDA_ACROSS_NODES", None)
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
        if op == "broadcast":
            t = torch.ones(count, dtype=dtype, device=dev)
            return (lambda: dist.broadcast(t, src=0, group=group)), count * esize, 1.0
        per = max(1, count // n)
        if op == "allgather":
            out = torch.empty(per * n, dtype=dtype, device=dev)
            inp = torch.ones(per, dtype=dtype, device=dev)
            return (lambda: dist.all_gather_into_tensor(out, inp, group=group)), per * n * esize, (n - 1) / n
        inp = torch.ones(per * n, dtype=dtype, device=dev)
        out = torch.empty(per, dtype=dtype, device=dev)
        return (lambda: dist.reduce_scatter_tensor(out, inp, group=group)), per * n * esize, (n - 1) / n

    def agreed_max(v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=agree)
        return t.item()

    def timed(fn):
        for _ in range(2):  # the first uses map buffers and make rails
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        est = agreed_max((time.perf_counter() - t0) / 2)
        iters = int(min(50, max(3, 1.0 / max(est, 1e-6))))
        dist.barrier(group=agree)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        return agreed_max((time.perf_counter() - t0) / iters)

    sizes = []
    s = parse_size(opts.min)
    while s <= parse_size(opts.max):
        sizes.append(s)
        s *= opts.factor
    paths = list(groups)
    results = {"nodes": opts.nodes, "ranks_per_node": opts.nproc_per_node, "world_size": n, "dtype": opts.dtype,
               "gpu": torch.cuda.get_device_name(dev), "gpus": torch.cuda.device_count(), "torch": torch.__version__,
               "paths": paths, "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")), "collectives": {}}
    say("# CUDA tensors across %d simulated nodes x %d ranks (%d GPU(s)), %s; columns by path, ratio %s/%s" % (
        opts.nodes, opts.nproc_per_node, torch.cuda.device_count(), opts.dtype, paths[0], paths[-1]))
    for op in opts.ops.split(","):
        say("\n# %s" % op)
        say("%10s" % "size" + "".join("  %12s %9s %9s" % (p[:12] + " us", "algbw", "busbw") for p in paths) +
            "  %8s" % "busbw x")
        rows = []
        for size in sizes:
            row = {"size": size}
            for path in paths:
                fn, nbytes, factor = make(op, size, groups[path])
                dt = timed(fn)
                row[path] = {"latency_us": dt * 1e6, "algbw_gbps": nbytes / dt / 1e9,
                             "busbw_gbps": nbytes / dt / 1e9 * factor}
                del fn
                torch.cuda.empty_cache()
            ratio = row[paths[0]]["busbw_gbps"] / row[paths[-1]]["busbw_gbps"]
            row["busbw_ratio"] = ratio
            rows.append(row)
            say("%10s" % human(size) + "".join("  %12.1f %9.3f %9.3f" % (
                row[p]["latency_us"], row[p]["algbw_gbps"], row[p]["busbw_gbps"]) for p in paths) + "  %8.2f" % ratio)
        results["collectives"][op] = rows

    # What crossed PCIe per rank per operation: the ranks' counts through the daemon's status.
    ctl = os.path.join(os.environ.get("SMDDP_BIN_DIR", ""), "smddp-ctl")
    job = os.environ.get("SMDDP_JOB_ID", "")

    def staged(node):
        if not os.access(ctl, os.X_OK) or not job:
            return None
        out = subprocess.run([ctl, "status", "--job", job, "--node", str(node), "--json"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, timeout=30).stdout
        try:
            return json.loads(out).get("traffic")
        except ValueError:
            return None

    pcie = {}
    for op in opts.ops.split(","):
        for path in paths:
            fn, nbytes, _ = make(op, sizes[-1], groups[path])
            fn()
            torch.cuda.synchronize()
            dist.barrier(group=agree)
            before = staged(0) if rank == 0 else None
            reps = 3
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
            dist.barrier(group=agree)
            after = staged(0) if rank == 0 else None
            del fn
            if rank == 0 and before and after:
                def delta(key, ranks=opts.nproc_per_node):
                    b = before.get("by_op", {}).get(op, {}).get(key, 0)
                    a = after.get("by_op", {}).get(op, {}).get(key, 0)
                    return (a - b) / reps / ranks
                pcie["%s.%s" % (op, path)] = {"bytes": nbytes, "to_host_per_rank": delta("to_host_bytes"),
                                              "to_device_per_rank": delta("to_device_bytes"),
                                              "daemon_reduced_per_node": delta("daemon_reduced_bytes", 1),
                                              "fabric_sent_per_node": delta("fabric_sent_bytes", 1)}
                say("%s %s %s: per rank and operation %.1f MiB device->host, %.1f MiB host->device; per node "
                    "%.1f MiB reduced by the daemon, %.1f MiB sent on the fabric" % (
                        op, human(sizes[-1]), path, delta("to_host_bytes") / 2**20, delta("to_device_bytes") / 2**20,
                        delta("daemon_reduced_bytes", 1) / 2**20, delta("fabric_sent_bytes", 1) / 2**20))
    results["pcie"] = pcie
    if rank == 0 and opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier(group=agree)
    dist.destroy_process_group()
    return 0


def main():
    argv = sys.argv[1:]
    opts = options(argv)
    if "RANK" not in os.environ:
        return launch(opts, argv)
    return bench(opts)


if __name__ == "__main__":
    sys.exit(main())
