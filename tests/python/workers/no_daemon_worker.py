"""init_process_group("smddp") without a daemon raises SMDDPDaemonUnreachableError at once,
with a message that says how to start one."""

import os

import torch.distributed as dist

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  (maps OMPI_* to RANK/...)
from smdistributed.dataparallel import exceptions as E
from common import Checker

chk = Checker(0)
if "OMPI_COMM_WORLD_RANK" in os.environ:
    chk.run("ompi_env_mapped", lambda: None if (os.environ.get("RANK"), os.environ.get("WORLD_SIZE"),
                                                   os.environ.get("LOCAL_RANK")) == ("0", "1", "0")
            else "RANK/WORLD_SIZE/LOCAL_RANK not mapped: %r" % dict(os.environ))
chk.expect("no_daemon_raises", E.SMDDPDaemonUnreachableError, dist.init_process_group, "smddp",
           contains="smddprun")
raise SystemExit(chk.finish())
