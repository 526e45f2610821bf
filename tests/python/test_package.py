"""The Python package on its own (no daemon): registration, environment mapping, errors."""

import os
import subprocess

from conftest import base_env, build_dir, python_exe

SNIPPET = r"""
import importlib, sys
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp as a
import smdistributed.dataparallel.torch.torch_smddp as b
# A second registration (reload) must be harmless.
importlib.reload(a)
assert "SMDDP" in dist.Backend._plugins and dist.Backend._plugins["SMDDP"].extended_api
assert dist.Backend.SMDDP == "smddp" or dist.Backend.SMDDP.lower() == "smddp"

from smdistributed.dataparallel import exceptions as E
from smdistributed.dataparallel.torch import _smddp_c as c
names = ["SMDDPError", "SMDDPInvalidArgumentError", "SMDDPUnsupportedError", "SMDDPMismatchError",
         "SMDDPPeerFailedError", "SMDDPTimeoutError", "SMDDPDaemonUnreachableError", "SMDDPShutdownError",
         "SMDDPInternalError"]
for kind, name in enumerate(names):
    try:
        c._raise_for_test(kind, "boom %d" % kind)
    except E.SMDDPError as e:
        assert type(e).__name__ == name and str(e) == "boom %d" % kind, (type(e), e)
        assert isinstance(e, RuntimeError)
    else:
        raise AssertionError("nothing raised")
assert c.client_info() is None

from smdistributed.dataparallel.torch import _launch
env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
       "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
_launch.map_launcher_env(env)
assert env["RANK"] == "3" and env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == "1"
assert env["LOCAL_WORLD_SIZE"] == "4" and env["MASTER_ADDR"] and env["MASTER_PORT"]
assert env["SMDATAPARALLEL_LOCAL_RANK"] == "1"
env2 = {"RANK": "5", "OMPI_COMM_WORLD_RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
_launch.map_launcher_env(env2)
assert env2["RANK"] == "5" and env2["MASTER_ADDR"] == "h"

import smdistributed.dataparallel.torch.distributed as sdist
assert sdist.ReduceOp.AVERAGE == dist.ReduceOp.AVG
try:
    sdist.get_rank()
except E.SMDDPError as e:
    assert "init_process_group" in str(e)
else:
    raise AssertionError("get_rank before init must raise")
print("PACKAGE-OK")
"""


def test_package_without_daemon():
    env = base_env(build_dir())
    proc = subprocess.run([python_exe(), "-c", SNIPPET], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "PACKAGE-OK" in proc.stdout, proc.stdout


def test_extension_is_built():
    ext_dir = os.path.join(build_dir(), "python", "smdistributed", "dataparallel", "torch")
    assert any(f.startswith("_smddp_c") and f.endswith(".so") for f in os.listdir(ext_dir))
