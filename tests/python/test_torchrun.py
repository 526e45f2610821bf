"""torchrun --nproc_per_node N with backend="smddp" (launch path 2: local rank 0 starts the
node's daemon): collectives, DDP parity and a failing rank, with 2 and 4 ranks. Skipped where
torchrun cannot start workers (Debian's torch 1.13 under Python 3.11); run on the GPU machine."""

import pytest

from conftest import run_job


@pytest.mark.parametrize("nproc", [2, 4])
def test_torchrun_collectives(nproc):
    run_job("collectives_worker.py", nproc, launcher="torchrun").assert_ok(min_checks=150)


@pytest.mark.parametrize("nproc", [2, 4])
def test_torchrun_ddp(nproc):
    job = run_job("ddp_worker.py", nproc, launcher="torchrun")
    job.assert_ok(min_checks=8)
    assert "ddp.plain" in job.names(0)


def test_torchrun_rank_failure_fails_the_job():
    # torchrun ends the survivors itself once a worker fails (its own policy), so only the
    # job's status, the victim's error and the cleanup are judged here.
    job = run_job("fail_worker.py", 2, args=[1, "raise"], timeout=120, launcher="torchrun")
    job.assert_launch_path()
    assert job.returncode != 0, job.output[-3000:]
    assert "deliberate failure of rank 1" in job.output
    assert not job.leftovers()
