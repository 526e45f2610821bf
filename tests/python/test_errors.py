"""Bad input raises the right SMDDPError subclass at once and the group stays usable; no daemon
is reported with how to start one."""

import time

from conftest import run_job, run_plain


def test_bad_input_raises_and_group_stays_usable():
    job = run_job("bad_input_worker.py", 2)
    job.assert_ok(min_checks=2 * 25)
    assert "bad.size_mismatch_across_ranks" in job.names(0)


def test_no_daemon_plain_python():
    t0 = time.time()
    res = run_plain("no_daemon_worker.py", env_overrides={"RANK": "0", "WORLD_SIZE": "1",
                                                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29631"})
    res.assert_ok(min_checks=1)
    assert time.time() - t0 < 60


def test_no_daemon_under_mpirun_env():
    # What plain `mpirun -np 1 python train.py` sets: no RANK, only OMPI_* variables.
    res = run_plain("no_daemon_worker.py", env_overrides={
        "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_PORT": "29632"})
    res.assert_ok(min_checks=2)
