"""Failures through smddprun: mismatches, a killed rank, a killed daemon. Every surviving
rank must get an error that says what happened within 5 s, and nothing may be left behind."""
import os
import re
import signal
import time

import pytest


def results(out):
    # Not anchored at a line's start: mpirun forwards a busy daemon's log in chunks that need not
    # end at a line's end, and a rank's line then follows part of a daemon line.
    return {int(m.group(1)): (float(m.group(2)), m.group(3))
            for m in re.finditer(r"RESULT (\d+) ([\d.]+) (.*)$", out, re.M)}


def wait_for_files(paths, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(p.exists() for p in paths):
            return
        time.sleep(0.05)
    raise AssertionError(f"not all of {paths} appeared")


def test_mismatch_fails_every_rank_naming_each_call(job):
    r = job.run(4, "failure_worker", "--mode", "mismatch")
    assert r.returncode == 0, r.stdout[-3000:]
    res = results(r.stdout)
    assert sorted(res) == [0, 1, 2, 3], r.stdout[-3000:]
    for rank, (_, msg) in res.items():
        assert "collective mismatch" in msg, msg
        for other in range(4):
            assert f"rank {other} called allreduce(float32, count={8 + other}" in msg, msg
    # The group stays usable after the mismatch.
    assert len(re.findall(r"^AFTER \d 4$", r.stdout, re.M)) == 4, r.stdout[-3000:]


def test_mismatch_between_the_fast_path_and_the_daemon_path(job):
    # Rank 0's allreduce is small enough for the ranks' host fast path, the others' go through
    # the daemon: every rank still gets the one error naming each call, and the group goes on.
    r = job.run(3, "failure_worker", "--mode", "mismatch-paths")
    assert r.returncode == 0, r.stdout[-3000:]
    res = results(r.stdout)
    assert sorted(res) == [0, 1, 2], r.stdout[-3000:]
    for rank, (_, msg) in res.items():
        assert "collective mismatch" in msg, msg
        assert "rank 0 called allreduce(float32, count=8, op=sum)" in msg, msg
        for other in (1, 2):
            assert f"rank {other} called allreduce(float32, count=100000" in msg, msg
    assert len(re.findall(r"^AFTER \d 3$", r.stdout, re.M)) == 3, r.stdout[-3000:]


def start_share_stop(job, timeout_s):
    """Three ranks call a large allreduce, whose ranks each reduce a share; rank 2 posts it and stops
    itself (SIGSTOP), and only then do the others post it. Returns the launcher and rank 2's pid."""
    proc = job.start(3, "failure_worker", "--mode", "share-stop", "--victim", 2, "--dir", job.dir,
                     "--seconds", timeout_s, extra=("--set", "daemon.stall_warning_s=1"))
    try:
        wait_for_files([job.dir / "victim.pid"])
        victim = int((job.dir / "victim.pid").read_text())
        deadline = time.time() + 30
        while time.time() < deadline and open(f"/proc/{victim}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            time.sleep(0.01)
        (job.dir / "go").touch()  # the others post only now: rank 2 cannot reduce its share
        wait_for_files([job.dir / "ready.0", job.dir / "ready.1"])
    except (AssertionError, OSError):
        proc.kill()
        raise
    return proc, victim


def test_a_rank_that_never_reduces_its_share_is_named_at_the_timeout(job):
    proc, victim = start_share_stop(job, 4)
    started = time.time()
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode != 0
    res = results(out)
    assert sorted(res) == [0, 1], out[-3000:]
    for rank, (at, msg) in res.items():
        assert "rank(s) 2 did not reduce their share" in msg, msg
        assert f"rank 2 (pid {victim}) is stopped" in msg, msg
        assert 3.0 < at - started < 4.0 + 3.0, (rank, at - started, msg)
    # The daemon says who the others wait for before their timeout.
    assert re.search(r"stall: allreduce .* for rank\(s\) 2\b", out), out[-3000:]


def test_a_rank_killed_before_it_reduces_its_share_fails_the_others_within_5s(job):
    proc, victim = start_share_stop(job, 60)
    time.sleep(0.5)  # the others now wait for its share
    kill_rank_2(proc, victim, [0, 1])


def check_killed_rank(job, nproc_per_node, extra=()):
    """Runs failure_worker over 4 ranks in all, SIGKILLs rank 2 once the others wait inside
    their allreduce, and checks that ranks 0, 1 and 3 fail within 5 s naming it."""
    proc = job.start(nproc_per_node, "failure_worker", "--mode", "stuck", "--victim", 2, "--dir", job.dir,
                     extra=extra)
    try:
        wait_for_files([job.dir / f"ready.{r}" for r in range(4)] + [job.dir / "victim.pid"])
        time.sleep(0.5)  # the others are now inside their allreduce
        victim = int((job.dir / "victim.pid").read_text())
    except AssertionError:
        proc.kill()
        raise
    kill_rank_2(proc, victim, [0, 1, 3])


def kill_rank_2(proc, victim, survivors):
    """SIGKILLs rank 2 (pid `victim`) and checks that every survivor fails within 5 s naming it."""
    try:
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    res = results(out)
    assert sorted(res) == survivors, out[-3000:]
    for rank, (at, msg) in res.items():
        assert at - killed_at < 5.0, (rank, at - killed_at, msg)
        assert f"rank 2 (pid {victim})" in msg and "SIGKILL" in msg, msg


def test_killed_rank_fails_the_others_within_5s(job):
    check_killed_rank(job, 4)


def test_ranks_away_when_their_daemon_dies_get_the_named_error_at_their_next_call(job):
    # The ranks work outside smddp for 14 s after their daemon is killed: longer than the 10 s
    # grace the orphan watch once had, shorter than its default (daemon.orphan_grace_s, 60 s),
    # so they are not ended before their next call. That call, a small allreduce the two ranks
    # could run among themselves on the host fast path, raises the named error.
    proc = job.start(2, "failure_worker", "--mode", "busy", "--seconds", 14, "--dir", job.dir)
    ranks = []
    try:
        wait_for_files([job.dir / f"ready.{r}" for r in range(2)])
        ranks = [int((job.dir / f"ready.{r}").read_text()) for r in range(2)]
        daemon = int(open(f"/proc/{ranks[0]}/stat").read().split(")")[1].split()[1])  # the ranks' parent
        os.kill(daemon, signal.SIGKILL)
        proc.communicate(timeout=60)
        wait_for_files([job.dir / f"result.{r}" for r in range(2)], timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode != 0
    for r in range(2):
        msg = (job.dir / f"result.{r}").read_text()
        assert f"smddp daemon (pid {daemon}) on node 0 died" in msg, msg


def test_killed_daemon_fails_every_rank_within_5s(job):
    proc = job.start(4, "failure_worker", "--mode", "stuck", "--victim", 3, "--dir", job.dir)
    victim = None
    try:
        wait_for_files([job.dir / f"ready.{r}" for r in range(4)] + [job.dir / "victim.pid"])
        time.sleep(0.5)
        victim = int((job.dir / "victim.pid").read_text())
        daemon = int(open(f"/proc/{victim}/stat").read().split(")")[1].split()[1])  # the rank's parent
        killed_at = time.time()
        os.kill(daemon, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if victim:
            try:
                os.kill(victim, signal.SIGKILL)  # the sleeping rank never calls smddp again
            except ProcessLookupError:
                pass
    assert proc.returncode != 0
    res = results(out)
    assert sorted(res) == [0, 1, 2], out[-3000:]
    for rank, (at, msg) in res.items():
        assert at - killed_at < 5.0, (rank, at - killed_at, msg)
        assert f"smddp daemon (pid {daemon}) on node 0 died" in msg, msg
