"""What the tests of MPI in ranks share (tests/integration/test_mpi_ranks.py,
tests/python/test_mpi_frontends.py): mpi4py must be there, and the ranks' PATH holds no ssh or rsh."""
import os
import shutil
import subprocess

import pytest


def _on_debian():
    try:
        with open("/etc/os-release") as f:
            return any(line.strip() in ("ID=debian", 'ID="debian"') for line in f)
    except OSError:
        return False


def require_mpi4py(python):
    """mpi4py must be importable by the ranks' Python. scripts/setup.sh installs it for
    Debian's python3, so there its absence is a failure; elsewhere (another distribution, a
    virtual environment, a machine where nothing can be installed) it may genuinely be missing,
    and the test skips saying so."""
    proc = subprocess.run([python, "-c", "import mpi4py"], capture_output=True, text=True)
    if proc.returncode == 0:
        return
    why = "mpi4py is not importable by %s: %s" % (python, proc.stderr.strip().splitlines()[-1:])
    if _on_debian() and os.path.realpath(python).startswith("/usr/bin/python3"):
        pytest.fail(why + " (scripts/setup.sh installs python3-mpi4py)")
    pytest.skip(why)


def path_without_ssh(directory, python):
    """A PATH holding only what a job needs (python3, mpirun), made in `directory`: no ssh, no rsh."""
    directory.mkdir()
    for name, target in (("python3", python), ("mpirun", shutil.which("mpirun"))):
        assert target, "%s not found" % name
        (directory / name).symlink_to(os.path.realpath(target))
    path = str(directory)
    assert shutil.which("ssh", path=path) is None and shutil.which("rsh", path=path) is None
    return path
