"""Ranks that use MPI under smddprun, without ssh or rsh anywhere on PATH.

A rank that smddprun starts is its daemon's child, not a process of the mpirun job, so its
MPI_Init makes a singleton; the daemon gives every rank OMPI_MCA_ess_singleton_isolated=1, so the
singleton starts no helper daemon (Open MPI 4.1's default one goes through ssh/rsh and aborts
where they are missing). COMM_WORLD is then rank 0 of 1 on every rank, as docs/configuration.md
says. The ranks run `python3 -m mpi4py mpi_rank.py` (mpi_rank.py says what each mode does).
mpi4py comes from Debian's python3-mpi4py, which scripts/setup.sh installs.
"""
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from conftest import REPO, bin_dir

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import mpi_without_ssh  # noqa: E402  (tests/mpi_without_ssh.py)

HERE = pathlib.Path(__file__).resolve().parent
RANK_SCRIPT = HERE / "mpi_rank.py"
PYTHON = sys.executable


def require_mpi4py():
    mpi_without_ssh.require_mpi4py(PYTHON)


@pytest.fixture
def no_ssh_path(tmp_path):
    return mpi_without_ssh.path_without_ssh(tmp_path / "bin", PYTHON)


def run_ranks(job, path, nproc, mode, extra=(), mpi4py_main=True, timeout=180):
    """smddprun --nproc-per-node nproc [extra] -- python3 [-m mpi4py] mpi_rank.py DIR MODE,
    with PATH=path. Returns (CompletedProcess, seconds, {rank: report})."""
    out = job.dir / "reports"
    out.mkdir(exist_ok=True)
    # The ranks keep the PATH given here, as on a host without ssh, although Open MPI puts its
    # own prefix's bin folder (/usr/bin, where Debian's ssh lives) first in its daemons' PATH.
    cmd = [str(bin_dir() / "smddprun"), "--job-id", job.id, "--nproc-per-node", str(nproc),
           "--config", str(REPO / "configs" / "local.ini"), *extra, "--",
           "python3", *(("-m", "mpi4py") if mpi4py_main else ()), str(RANK_SCRIPT), str(out), mode]
    env = dict(job.env, PATH=path)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_MCA_ess_singleton_isolated"):
        env.pop(name, None)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout)
    reports = {int(p.name.split(".")[1]): json.loads(p.read_text()) for p in out.glob("rank.*.json")}
    return proc, time.monotonic() - t0, reports


def check_singletons(proc, reports, world):
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert sorted(reports) == list(range(world)), (reports, proc.stdout[-3000:])
    for rank, r in reports.items():
        assert r["ssh"] is None and r["rsh"] is None, r
        assert r["under_mpi4py_run"], r
        assert r["rank_env"] == rank and r["world_env"] == world, r
        # The documented singleton: rank 0 of 1 on every rank, MPI collectives over itself.
        assert (r["comm_rank"], r["comm_size"], r["comm_sum"]) == (0, 1, rank + 1), r
        assert r["isolated"] == "1", r
        assert r["launcher_vars"] == [], "mpirun's variables reached the rank: %s" % r


def test_python_m_mpi4py_on_one_node_without_ssh(job, no_ssh_path):
    require_mpi4py()
    proc, _, reports = run_ranks(job, no_ssh_path, 2, "mpi")
    check_singletons(proc, reports, 2)


def test_python_m_mpi4py_across_two_simulated_nodes_without_ssh(job, no_ssh_path):
    require_mpi4py()
    proc, _, reports = run_ranks(job, no_ssh_path, 2, "mpi", extra=("--simulate-nodes", "2"))
    check_singletons(proc, reports, 4)


def test_uncaught_exception_under_python_m_mpi4py_fails_the_job(job, no_ssh_path):
    # mpi4py's runner prints the traceback and calls MPI_Abort; the singleton's abort ends that
    # rank with a non-zero status, and the daemon fails the job: the other rank is stopped
    # (after daemon.exit_grace_s, 5 s in local.ini) instead of sleeping its 120 s.
    require_mpi4py()
    proc, elapsed, reports = run_ranks(job, no_ssh_path, 2, "raise")
    out = proc.stdout
    assert proc.returncode != 0, out[-3000:]
    assert sorted(reports) == [0, 1], out[-3000:]
    assert "RuntimeError: rank 1 fails on purpose" in out, out[-3000:]
    assert "rank 1 (pid" in out and "exited with status" in out, out[-3000:]
    assert elapsed < 60, "the job took %.0f s to fail" % elapsed


def test_a_users_singleton_setting_reaches_the_ranks(job, no_ssh_path):
    # Only singletons read it, so a value the user gives smddprun is meant for the ranks: kept.
    user = ("--mca", "ess_singleton_isolated", "0")
    proc, _, reports = run_ranks(job, no_ssh_path, 2, "env", extra=user, mpi4py_main=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert sorted(reports) == [0, 1], proc.stdout[-3000:]
    for r in reports.values():
        assert r["isolated"] == "0" and r["launcher_vars"] == [], r
        assert r["ssh"] is None and r["rsh"] is None, r
    # With it, MPI_Init is Open MPI's default singleton again, which needs ssh or rsh: the abort
    # these tests would hit without the daemon's setting.
    for p in (job.dir / "reports").iterdir():
        p.unlink()
    proc, _, reports = run_ranks(job, no_ssh_path, 1, "mpi", extra=user)
    assert proc.returncode != 0 and reports == {}, proc.stdout[-3000:]
    assert "plm_rsh_agent" in proc.stdout, proc.stdout[-3000:]
