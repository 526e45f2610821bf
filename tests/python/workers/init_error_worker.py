"""init_process_group("smddp") must raise at once (no hang) an exception of the class named by
argv[1] whose message contains every further argument, e.g. how to start a daemon.

    python init_error_worker.py SMDDPDaemonUnreachableError smddprun SMDDP_DAEMON
"""

import os
import sys
import time

import torch.distributed as dist

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  (maps OMPI_* to RANK/...)
from smdistributed.dataparallel import exceptions as E
from common import Checker, emit

rank = int(os.environ.get("RANK", "0"))
chk = Checker(rank)
exc_name, needles = sys.argv[1], sys.argv[2:]
if os.environ.get("OMPI_COMM_WORLD_SIZE") == "1":  # the single-process imitation of mpirun
    want = (os.environ["OMPI_COMM_WORLD_RANK"], os.environ["OMPI_COMM_WORLD_SIZE"],
            os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    chk.run("ompi_env_mapped", lambda: None if (os.environ.get("RANK"), os.environ.get("WORLD_SIZE"),
                                                   os.environ.get("LOCAL_RANK")) == want
            else "RANK/WORLD_SIZE/LOCAL_RANK not mapped: %r" % dict(os.environ))


def init_must_fail():
    # One attempt only: torch cannot redo a failed init_process_group with the same store.
    t0 = time.time()
    try:
        dist.init_process_group("smddp")
    except getattr(E, exc_name) as e:
        missing = [n for n in needles if n not in str(e)]
        return "message lacks %s: %s" % (missing, e) if missing else None
    except Exception as e:  # noqa: BLE001
        return "raised %s, expected %s: %s" % (type(e).__name__, exc_name, e)
    finally:
        emit("SMDDP-INIT-SECONDS %d %.3f" % (rank, time.time() - t0))
    return "init_process_group did not raise"


chk.run("init_raises." + exc_name, init_must_fail)
raise SystemExit(chk.finish())
