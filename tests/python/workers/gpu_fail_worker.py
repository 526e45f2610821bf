"""A rank dies (SIGKILL) during hierarchical CUDA all-reduces across simulated nodes; the others,
whose GPUs may wait for it in a barrier or whose shards wait for its node, must get an
SMDDPError naming it, and their GPUs must drain (nothing left waiting on a flag that never
comes). Ranks may share one GPU (SMDDP_TEST_GPU_BY_RANK=1). Prints
'SMDDP-VICTIM <rank> <time>' just before the victim dies,
'SMDDP-SURVIVOR <rank> <exception class> <time> <message>' when a survivor's collective fails and
'SMDDP-DRAINED <rank>' once its GPU finished everything it was given.
Arguments: <victim rank> <phase>, phase one of:
  before  the victim dies before it posts the operation: its node's members wait for it in the
          in-node barrier on their GPUs, the other nodes' shards wait for its rail
  during  the victim posts the operation and dies while it is in flight (its copies, its rail)
  after   the victim finishes one operation and dies at once: the others may still be in that
          operation's last part (the pushes and the closing barrier) or in the next one"""

import datetime
import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
from common import announce, emit

local = int(os.environ.get("LOCAL_RANK", "0"))
if os.environ.get("SMDDP_TEST_GPU_BY_RANK") == "1":
    local = int(os.environ["RANK"]) % torch.cuda.device_count()
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=60))
rank, W = dist.get_rank(), dist.get_world_size()
announce(rank)
victim, phase = int(sys.argv[1]), sys.argv[2]
N = 8 << 20  # 32 MiB of float32: large enough for the hierarchical path whatever its threshold


def line(text):
    # Also into the test's record folder: Open MPI's output forwarding may cut a line in two.
    emit(text.replace("\n", " | "))


def die():
    line("SMDDP-VICTIM %d %.6f" % (rank, time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


for _ in range(3):  # good steps first: the rails exist, the mappings are made
    t = torch.ones(N, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    assert bool((t == W).all().item())

# SMDDP_TEST_STACKS_AFTER=S: a survivor still in its collectives S seconds from here prints its
# Python stacks and, where gdb is installed, every thread's native stack (where it hangs).
stacks_after = float(os.environ.get("SMDDP_TEST_STACKS_AFTER", "0"))
watchdog = None
if stacks_after > 0 and rank != victim:
    faulthandler.dump_traceback_later(stacks_after, exit=False)

    def native_stacks():
        gdb = shutil.which("gdb")
        if gdb:
            out = subprocess.run([gdb, "-p", str(os.getpid()), "-batch", "-ex", "thread apply all bt"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60).stdout
            sys.stderr.write("SMDDP-STACKS rank %d\n%s\n" % (rank, out))
    watchdog = threading.Timer(stacks_after + 0.5, native_stacks)
    watchdog.daemon = True
    watchdog.start()

if rank == victim:
    if phase == "before":
        time.sleep(0.5)  # the others are in the next all-reduce by now
        die()
    t = torch.ones(N, device=dev)
    w = dist.all_reduce(t, async_op=True)
    if phase == "during":
        time.sleep(0.002)  # posted, and its GPU and copies have work in flight
        die()
    w.wait()
    torch.cuda.synchronize()
    die()

try:
    for _ in range(20):
        t = torch.ones(N, device=dev)
        dist.all_reduce(t)
        torch.cuda.synchronize()
    line("SMDDP-SURVIVOR %d none %.6f the collectives without rank %d succeeded" % (rank, time.time(), victim))
    rc = 0
except Exception as e:  # noqa: BLE001 - the test judges the class and the message
    line("SMDDP-SURVIVOR %d %s %.6f %s" % (rank, type(e).__name__, time.time(), e))
    rc = 1
if watchdog is not None:
    faulthandler.cancel_dump_traceback_later()
    watchdog.cancel()
# The GPU must not be left waiting for the victim: everything given to it finishes.
done = threading.Event()
threading.Thread(target=lambda: (torch.cuda.synchronize(), done.set()), daemon=True).start()
if done.wait(30):
    line("SMDDP-DRAINED %d" % rank)
sys.stdout.flush()
os._exit(rc)
