"""Fixtures for smddprun tests: which copy to test, fake mpirun/daemon scripts, a clean env.

SMDDP_BIN_DIR (set by CTest) selects the built copy ${CMAKE_BINARY_DIR}/bin/smddprun;
without it the source tree's launcher/smddprun is tested.
"""

import importlib.machinery
import importlib.util
import os
import shlex
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Interpreter that runs the launcher in subprocess tests; set it to check an old python3
# (e.g. SMDDP_LAUNCHER_PYTHON=python3.8).
LAUNCHER_PYTHON = os.environ.get("SMDDP_LAUNCHER_PYTHON", sys.executable)


def launcher_path():
    bin_dir = os.environ.get("SMDDP_BIN_DIR")
    if bin_dir:
        return os.path.join(bin_dir, "smddprun")
    return os.path.join(REPO, "launcher", "smddprun")


def load_launcher_module(path=None):
    """Import the smddprun script (it has no .py suffix) as a module."""
    path = path or launcher_path()
    loader = importlib.machinery.SourceFileLoader("smddprun_under_test", path)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def write_script(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


class Tools:
    """Fake mpirun and smddp-daemon in a temporary folder, each recording its argv."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.mpirun_record = tmp_path / "mpirun.argv"
        self.daemon_record = tmp_path / "daemon.argv"
        self.mpirun = write_script(
            tmp_path / "fake-mpirun",
            "#!/bin/sh\nprintf '%%s\\n' \"$@\" > '%s'\nexit 3\n" % self.mpirun_record)
        self.daemon = write_script(
            tmp_path / "fake-smddp-daemon",
            "#!/bin/sh\nprintf '%%s\\n' \"$@\" >> '%s'\nexit 0\n" % self.daemon_record)

    def base_env(self):
        """A minimal environment: no SMDDP_* or PYTHONPATH leaking in from the caller."""
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": os.environ.get("HOME", "/tmp"),
            "LANG": "C.UTF-8",
            "SMDDP_MPIRUN": self.mpirun,
            "SMDDP_DAEMON": self.daemon,
        }
        return env


@pytest.fixture
def tools(tmp_path):
    return Tools(tmp_path)


@pytest.fixture(scope="session")
def launcher():
    return launcher_path()


@pytest.fixture(scope="session")
def module():
    return load_launcher_module()


class Result:
    def __init__(self, completed):
        self.returncode = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr

    @property
    def argv(self):
        """The dry-run line split back into words."""
        lines = self.stdout.strip().splitlines()
        assert len(lines) == 1, "dry-run must print exactly one line, got: %r" % self.stdout
        return shlex.split(lines[0])


@pytest.fixture
def run_launcher(launcher, tools):
    def run(args, env=None, extra_env=None, script=None, timeout=60):
        env = dict(tools.base_env() if env is None else env)
        env.update(extra_env or {})
        completed = subprocess.run([LAUNCHER_PYTHON, script or launcher] + list(args), env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   universal_newlines=True, timeout=timeout, check=False)
        return Result(completed)
    return run
