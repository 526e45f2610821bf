"""CPU time to issue an op (host tensors, 2 ranks): 64 async all_reduces of distinct 8 B
tensors issued back to back, then waited; the issue loop's time per op, median of 40 rounds;
and synchronous 8 B all_reduces, us per op."""
import time, statistics as st, torch, torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp  # noqa
dist.init_process_group("smddp")
r = dist.get_rank()
ts = [torch.ones(2) for _ in range(64)]
issue = []
for rnd in range(45):
    dist.barrier()
    t0 = time.perf_counter_ns()
    ws = [dist.all_reduce(t, async_op=True) for t in ts]
    t1 = time.perf_counter_ns()
    for w in ws:
        w.wait()
    if rnd >= 5:
        issue.append((t1 - t0) / 64 / 1e3)
t = torch.ones(2)
sync = []
for rnd in range(7):
    dist.barrier()
    t0 = time.perf_counter_ns()
    for _ in range(500):
        dist.all_reduce(t)
    sync.append((time.perf_counter_ns() - t0) / 500 / 1e3)
if r == 0:
    print("issue us/op median %.2f (p10 %.2f)  sync us/op median %.2f" % (
        st.median(issue), sorted(issue)[len(issue) // 10], st.median(sync)), flush=True)
dist.destroy_process_group()
