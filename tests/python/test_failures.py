"""A rank that raises (or is killed) during training makes the others fail within 5 s with an
SMDDPError naming it, under both launch paths, and the job's exit code is non-zero; the daemon
and its segment are gone afterwards."""

import re

import pytest

from conftest import run_job

# Plain mpirun aborts the whole job as soon as one rank exits non-zero, which may kill the
# survivors before they report; this variant lets them finish so their errors can be judged.
KEEP_SURVIVORS = ("--mca", "orte_abort_on_non_zero_status", "0")


def survivors_report(job, victim, nproc, how_soon_s=5.0):
    tail = job.output[-4000:]
    # The records, not the output: mpirun's forwarding may cut a line and splice another in.
    m = re.search(r"^SMDDP-VICTIM (\d+) ([0-9.]+)$", job.records, re.M)
    assert m and int(m.group(1)) == victim, "the victim did not get to fail\n" + tail
    t_victim = float(m.group(2))
    reports = {int(r): (cls, float(t), msg) for r, cls, t, msg in
               re.findall(r"^SMDDP-SURVIVOR (\d+) (\S+) ([0-9.]+) (.*)$", job.records, re.M)}
    assert sorted(reports) == [r for r in range(nproc) if r != victim], "survivor reports: %s\n%s" % (reports, tail)
    for r, (cls, t, msg) in reports.items():
        assert cls == "SMDDPPeerFailedError", "rank %d raised %s: %s" % (r, cls, msg)
        assert re.search(r"\brank %d\b" % victim, msg), "rank %d's error does not name rank %d: %s" % (r, victim, msg)
        # Measured from just before the victim's exit, so this over-estimates the delay.
        assert t - t_victim < how_soon_s, "rank %d learned of the failure after %.1f s: %s" % (r, t - t_victim, msg)
    return reports


@pytest.mark.parametrize("how", ["raise", "sigkill"])
@pytest.mark.parametrize("nproc", [2, 4])
def test_smddprun_rank_failure(nproc, how):
    job = run_job("fail_worker.py", nproc, args=[nproc - 1, how], timeout=120)
    assert job.returncode != 0, job.output[-3000:]
    survivors_report(job, nproc - 1, nproc)
    assert not job.leftovers()


# Only "raise": Open MPI 4.1's mpirun hangs after a rank dies of a signal when
# orte_abort_on_non_zero_status is 0 (also without smddp), and with the default it kills the
# survivors at once, racing their reports.
@pytest.mark.parametrize("nproc", [2, 4])
def test_mpirun_rank_failure_survivors_get_error(nproc):
    job = run_job("fail_worker.py", nproc, args=[1, "raise"], timeout=120, launcher="mpirun",
                  mpirun_args=KEEP_SURVIVORS)
    job.assert_launch_path()
    survivors_report(job, 1, nproc)
    assert not job.leftovers()


def test_mpirun_rank_failure_fails_the_job():
    # Default mpirun: the job's exit status is non-zero and nothing is left behind.
    job = run_job("fail_worker.py", 4, args=[2, "raise"], timeout=120, launcher="mpirun")
    job.assert_launch_path()
    assert job.returncode != 0, job.output[-3000:]
    assert "deliberate failure of rank 2" in job.output
    assert not job.leftovers()
