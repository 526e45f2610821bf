"""Where the time of a small CUDA all-reduce goes (run under smddprun with 2 ranks): CPU time
to issue and to wait, GPU time to drain, per op; the same for a host tensor; the daemon's GPU
statistics. Prints 'PROBE <name> <value>' lines from rank 0."""

import json
import os
import subprocess
import time

import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401

local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local % torch.cuda.device_count())  # ranks may share a GPU
dist.init_process_group("smddp")
rank = dist.get_rank()


def out(name, value):
    if rank == 0:
        print("PROBE %s %s" % (name, value), flush=True)


for n in (2, 1 << 20):
    t = torch.ones(n, device="cuda")
    for _ in range(20):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    k = 200
    t0 = time.perf_counter()
    for _ in range(k):
        dist.all_reduce(t)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    out("sync_loop_n%d_cpu_us" % n, (t1 - t0) / k * 1e6)
    out("sync_loop_n%d_total_us" % n, (t2 - t0) / k * 1e6)
    t0 = time.perf_counter()
    works = [dist.all_reduce(t, async_op=True) for _ in range(k)]
    t1 = time.perf_counter()
    for w in works:
        w.wait()
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    out("async_n%d_issue_us" % n, (t1 - t0) / k * 1e6)
    out("async_n%d_wait_us" % n, (t2 - t1) / k * 1e6)
    out("async_n%d_gpu_drain_us" % n, (t3 - t2) / k * 1e6)
h = torch.ones(2)
for _ in range(20):
    dist.all_reduce(h)
t0 = time.perf_counter()
for _ in range(200):
    dist.all_reduce(h)
out("host_sync_us", (time.perf_counter() - t0) / 200 * 1e6)
if rank == 0:
    from smdistributed.dataparallel.torch import _smddp_c
    info = _smddp_c.client_info() or {}
    ctl = os.path.join(os.environ.get("SMDDP_BIN_DIR", ""), "smddp-ctl")
    try:
        st = subprocess.run([ctl, "status", "--job", info.get("job_id", ""), "--json"], capture_output=True, text=True,
                            timeout=20).stdout
        out("gpu_status", json.dumps(json.loads(st).get("gpu")))
    except Exception as e:  # noqa: BLE001
        out("gpu_status_error", repr(e))
dist.barrier()
dist.destroy_process_group()
