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

# Launch path detection and the local layout of launch path 2.
assert _launch.launched_by_smddprun({"SMDDP_JOB_ID": "j"})
assert not _launch.launched_by_smddprun({"SMDDP_JOB_ID": "j", _launch.ATTACH_MARKER: "1"})
assert not _launch.launched_by_smddprun({})
assert _launch.local_layout(None, 3, 8, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}) == (1, 4)
assert _launch.local_layout(None, 3, 8, {"OMPI_COMM_WORLD_LOCAL_RANK": "2",
                                        "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == (2, 4)
try:
    _launch.local_layout(None, 0, 2, {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"})
except E.SMDDPInvalidArgumentError as e:
    assert "inconsistent" in str(e)
else:
    raise AssertionError("bad layout accepted")


class DictStore:  # what local_layout needs of a c10d Store
    def __init__(self):
        self.d = {}

    def set(self, k, v):
        self.d[k] = v.encode() if isinstance(v, str) else v

    def get(self, k):
        return self.d[k]


st = DictStore()
import socket
for r in range(3):
    st.set(_launch._HOST_KEY % (_launch._generation, r), "elsewhere" if r == 1 else socket.gethostname())
assert _launch.local_layout(st, 2, 3, {}) == (1, 2)

# The daemon program of this build is found without PATH or SMDDP_DAEMON.
import os
os.environ.pop("SMDDP_DAEMON", None)
from smdistributed.dataparallel import _paths
assert _launch.find_daemon() == os.path.join(_paths.BIN_DIR, "smddp-daemon"), _launch.find_daemon()
os.environ["SMDDP_DAEMON"] = "/nonexistent"
try:
    _launch.find_daemon()
except E.SMDDPDaemonUnreachableError as e:
    assert "SMDDP_DAEMON" in str(e) and "smddprun" in str(e)
else:
    raise AssertionError("a missing SMDDP_DAEMON was accepted")
assert c.segment_name("pt-1", 0) == "smddp.pt-1.n0", c.segment_name("pt-1", 0)
c.check_job_id(_launch._new_job_id())
try:
    c.check_job_id("bad/id")
except E.SMDDPInvalidArgumentError:
    pass
else:
    raise AssertionError("bad job id accepted")

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
