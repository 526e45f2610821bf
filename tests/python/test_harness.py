"""The judge of the plugin tests (conftest.JobResult) on made-up job records: it must refuse a
job whose ranks did not all check enough, a record that was lost, a job nobody reported, and
ranks that did not learn their job or daemon, so that none of these can pass a test."""

import os
import types

import pytest

from conftest import JobResult

GONE_PID = 2 ** 22 + 12345  # above the default pid_max: never a live process


def job(lines, world=2, returncode=0, launcher="smddprun"):
    proc = types.SimpleNamespace(returncode=returncode, stdout="\n".join(lines) + "\n")
    return JobResult(proc, launcher, records="", world=world)


def rank_lines(rank, checks, done=None, job_id="j1", pid=GONE_PID, path="1"):
    out = ["SMDDP-JOB %d %s %d %s" % (rank, job_id, pid, path)]
    out += ["SMDDP-CHECK %d c%d OK " % (rank, i) for i in range(checks)]
    out.append("SMDDP-DONE rank %d checks %d failed 0" % (rank, checks if done is None else done))
    return out


def test_every_rank_that_checked_enough_passes():
    job(rank_lines(0, 3) + rank_lines(1, 3)).assert_ok(min_checks=3)


def test_one_rank_checking_for_all_fails():
    # Six checks in all: enough for the whole job, none from rank 1.
    with pytest.raises(AssertionError, match="rank 1 made 0 checks"):
        job(rank_lines(0, 6) + rank_lines(1, 0)).assert_ok(min_checks=3)


def test_a_rank_without_its_done_line_fails():
    lines = rank_lines(0, 3) + rank_lines(1, 3)[:-1]
    with pytest.raises(AssertionError, match=r"ranks \[1\] of 2 wrote no SMDDP-DONE"):
        job(lines).assert_ok(min_checks=3)


def test_lost_check_lines_fail():
    # Rank 1 says it made 4 checks; only 3 lines arrived.
    with pytest.raises(AssertionError, match="rank 1 made 4 checks, 3 were read"):
        job(rank_lines(0, 4) + rank_lines(1, 3, done=4)).assert_ok(min_checks=3)


def test_a_failed_check_fails():
    lines = rank_lines(0, 3) + rank_lines(1, 3)
    lines[2] = "SMDDP-CHECK 0 c1 FAIL wrong"
    with pytest.raises(AssertionError, match="failed checks"):
        job(lines).assert_ok(min_checks=1)


def test_leftovers_need_every_rank_reported():
    with pytest.raises(AssertionError, match="SMDDP-JOB from ranks"):
        job(["SMDDP-CHECK 0 x OK "]).leftovers(wait_s=0)
    lines = rank_lines(0, 1) + [line for line in rank_lines(1, 1) if not line.startswith("SMDDP-JOB")]
    with pytest.raises(AssertionError, match=r"SMDDP-JOB from ranks \[0\] of 2"):
        job(lines).leftovers(wait_s=0)


@pytest.mark.parametrize("job_id,pid", [("?", GONE_PID), ("j1", 0)])
def test_leftovers_refuse_ranks_that_did_not_learn_their_job(job_id, pid):
    lines = rank_lines(0, 1) + rank_lines(1, 1, job_id=job_id, pid=pid)
    with pytest.raises(AssertionError, match="did not learn their job or daemon"):
        job(lines).leftovers(wait_s=0)


def test_leftovers_find_a_live_daemon():
    lines = rank_lines(0, 1, pid=os.getpid()) + rank_lines(1, 1, pid=os.getpid())
    assert job(lines).leftovers(wait_s=0) == ["daemon pid %d still running" % os.getpid()]


def test_the_launch_path_is_checked():
    with pytest.raises(AssertionError, match="launch paths"):
        job(rank_lines(0, 1) + rank_lines(1, 1, path="2")).assert_ok(min_checks=1)


def test_a_failing_init_must_not_have_joined_a_job():
    lines = ["SMDDP-CHECK 0 init OK ", "SMDDP-DONE rank 0 checks 1 failed 0"]
    job(lines, world=1).assert_ok(min_checks=1, started=False)
    with pytest.raises(AssertionError, match="joined a job"):
        job(rank_lines(0, 1), world=1).assert_ok(min_checks=1, started=False)
