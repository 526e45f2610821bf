"""One rank raises in the middle of training and exits; the others, blocked in the collective
it never joins, must get an SMDDPError naming it. Prints
'SMDDP-VICTIM <rank> <time>' just before the victim raises and
'SMDDP-SURVIVOR <rank> <exception class> <time> <message>' when a survivor's collective fails;
survivors then exit 1 (the job fails). Arguments: [victim rank] [raise|sigkill]."""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
from common import announce, emit

torch.set_num_threads(1)
# A short process-group timeout: if the failure were never reported the survivors would still
# end (with a timeout error the test rejects) instead of hanging the test.
dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=60))
rank, W = dist.get_rank(), dist.get_world_size()
announce(rank)
victim = int(sys.argv[1]) if len(sys.argv) > 1 else W - 1
how = sys.argv[2] if len(sys.argv) > 2 else "raise"  # raise | sigkill


def line(text):
    # Also into the test's record folder: Open MPI's output forwarding may cut a line in two.
    emit(text.replace("\n", " | "))


for _ in range(5):  # a few good steps first
    t = torch.ones(16)
    dist.all_reduce(t)
    assert bool((t == W).all())

if rank == victim:
    time.sleep(0.5)  # the others are waiting in the next all_reduce by now
    line("SMDDP-VICTIM %d %.6f" % (rank, time.time()))
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("deliberate failure of rank %d during training" % rank)

try:
    t = torch.ones(16)
    dist.all_reduce(t)
    line("SMDDP-SURVIVOR %d none %.6f the collective without rank %d succeeded" % (rank, time.time(), victim))
    sys.exit(0)
except Exception as e:  # noqa: BLE001 - the test judges the class and the message
    line("SMDDP-SURVIVOR %d %s %.6f %s" % (rank, type(e).__name__, time.time(), e))
    sys.exit(1)
