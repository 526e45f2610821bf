"""Shared helpers for the integration tests: they start real daemons and ranks through
smddprun, each job with its own job id and socket directory."""
import os
import pathlib
import subprocess
import uuid

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def bin_dir():
    d = os.environ.get("SMDDP_BIN_DIR")
    return pathlib.Path(d) if d else REPO / "build" / "bin"


class Job:
    def __init__(self, tmp_path):
        self.id = "it-" + uuid.uuid4().hex[:10]
        self.sockets = tmp_path / "sockets"
        self.sockets.mkdir(mode=0o700)
        self.dir = tmp_path
        self.env = dict(os.environ, SMDDP_SOCKET_DIR=str(self.sockets))

    def argv(self, nproc, program, *args, extra=()):
        return [str(bin_dir() / "smddprun"), "--job-id", self.id, "--nproc-per-node", str(nproc),
                "--config", str(REPO / "configs" / "local.ini"), *extra, "--",
                str(bin_dir() / program), *map(str, args)]

    def run(self, nproc, program, *args, timeout=600, extra=()):
        return subprocess.run(self.argv(nproc, program, *args, extra=extra), env=self.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)

    def start(self, nproc, program, *args, extra=()):
        return subprocess.Popen(self.argv(nproc, program, *args, extra=extra), env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def leftovers(self):
        shm = [p.name for p in pathlib.Path("/dev/shm").glob(f"smddp.{self.id}.*")]
        socks = [p.name for p in self.sockets.iterdir()]
        return shm + socks


@pytest.fixture
def job(tmp_path):
    j = Job(tmp_path)
    yield j
    assert j.leftovers() == [], "the job left files behind"
