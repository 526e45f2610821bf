"""Bad input raises the right SMDDPError subclass at once and the group stays usable, under
both launch paths; init_process_group without a reachable daemon, or with a layout launch
path 2 cannot serve yet, says what is wrong and how to start a job."""

import re

import pytest

from conftest import LAUNCHERS, build_dir, daemon_path, run_job, run_plain

SINGLE = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_bad_input_raises_and_group_stays_usable(launcher, nproc):
    job = run_job("bad_input_worker.py", nproc, launcher=launcher)
    job.assert_ok(min_checks=25)
    assert "bad.size_mismatch_across_ranks" in job.names(0)


# init_process_group's failures must come at once: well under the 30 s a rank waits for its
# daemon by default (SMDDP_ATTACH_TIMEOUT), however loaded the machine.
AT_ONCE_S = 15.0


def assert_init_failed_at_once(res, ranks=1, bound_s=AT_ONCE_S):
    """Every rank timed its failing init_process_group (SMDDP-INIT-SECONDS), within bound_s."""
    seconds = {int(r): float(s) for r, s in re.findall(r"^SMDDP-INIT-SECONDS (\d+) ([0-9.]+)$", res.records, re.M)}
    assert sorted(seconds) == list(range(ranks)), "init timings by rank: %s\n%s" % (seconds, res.output[-2000:])
    slow = {r: s for r, s in seconds.items() if s >= bound_s}
    assert not slow, "init_process_group took %s s to fail (bound %s s)" % (slow, bound_s)


def test_no_daemon_for_smddprun_job_id(master_port):
    # SMDDP_JOB_ID says smddprun started us, but no daemon of that job exists.
    res = run_plain("init_error_worker.py", ["SMDDPDaemonUnreachableError", "smddprun", "no-such-job"],
                    env_overrides={**SINGLE, "MASTER_PORT": master_port, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                                   "SMDDP_JOB_ID": "no-such-job", "SMDDP_ATTACH_TIMEOUT": "1"})
    res.assert_ok(min_checks=1, started=False)
    # SMDDP_ATTACH_TIMEOUT=1: one second of looking for the job's daemon, then the error.
    assert_init_failed_at_once(res)


def test_no_daemon_program_plain_python(master_port):
    # Launch path 2 where the daemon program cannot be found: say how to get one.
    res = run_plain("init_error_worker.py", ["SMDDPDaemonUnreachableError", "smddprun", "SMDDP_DAEMON"],
                    env_overrides={**SINGLE, "MASTER_PORT": master_port, "SMDDP_DAEMON": "/nonexistent/smddp-daemon"})
    res.assert_ok(min_checks=1, started=False)
    assert_init_failed_at_once(res)


def test_no_daemon_program_under_mpirun_env(master_port):
    # What plain `mpirun -np 1 python train.py` sets: no RANK, only OMPI_* variables.
    res = run_plain("init_error_worker.py", ["SMDDPDaemonUnreachableError", "smddprun"], env_overrides={
        "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_PORT": master_port, "SMDDP_DAEMON": "/nonexistent/smddp-daemon"})
    res.assert_ok(min_checks=2, started=False)
    assert_init_failed_at_once(res)


def test_daemon_that_dies_at_start(master_port):
    res = run_plain("init_error_worker.py", ["SMDDPDaemonUnreachableError", "exited with status 1"],
                    env_overrides={**SINGLE, "MASTER_PORT": master_port, "SMDDP_DAEMON": "/bin/false"})
    res.assert_ok(min_checks=1, started=False)
    assert_init_failed_at_once(res)


def test_plain_python_single_rank_starts_its_daemon(master_port):
    # No launcher at all (RANK/WORLD_SIZE by hand, no LOCAL_*): the layout comes from the store.
    daemon_path(build_dir())
    res = run_plain("v1_api_worker.py", env_overrides={**SINGLE, "MASTER_PORT": master_port})
    res.launcher = "mpirun"  # launch path 2
    res.assert_ok(min_checks=2)


def test_mpirun_simulated_nodes_must_divide_the_world():
    # Jobs across nodes work under plain mpirun (tests/python/test_multinode.py); a split of 2
    # ranks into 3 simulated nodes is a clear error on every rank.
    job = run_job("init_error_worker.py", 2, args=["SMDDPInvalidArgumentError", "SMDDP_SIMULATE_NODES=3", "divisor"],
                  launcher="mpirun", extra_env={"SMDDP_SIMULATE_NODES": "3"}, timeout=60)
    job.assert_ok(min_checks=1, started=False)
    assert_init_failed_at_once(job, ranks=2)
