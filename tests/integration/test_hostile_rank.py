"""A hostile rank (tests/integration/hostile_rank.cpp) writes into its own part of the shared
segment behind the client library's back. The daemon must never crash and never corrupt another
rank's results: a corrupted ring or a rank that never reads its completions fails the job,
naming that rank, on every rank within seconds; descriptors of random bytes are refused one by
one (each fails only its own request, DESIGN.md's rule for a malformed descriptor) and the job
goes on with correct results. Nothing is left behind either way."""
import re

import pytest

from test_failures import results

HOSTILE = 1

# The daemon logs the first 10 refused requests of a rank and counts the rest. mpirun forwards
# its output in chunks that need not end at a line's end, so a rank's line can follow part of a
# daemon line: the rank lines are matched where they start, not at a line's start.


def run(job, mode, nproc=4, extra=()):
    r = job.run(nproc, "hostile_rank", "--mode", mode, "--hostile", HOSTILE, timeout=120, extra=extra)
    assert "WRONG" not in r.stdout, r.stdout[-3000:]
    assert not re.search(r"Segmentation|core dumped|Aborted", r.stdout), r.stdout[-3000:]
    m = re.search(r"ATTACK ([\d.]+)$", r.stdout, re.M)
    assert m, "the hostile rank did not get to attack:\n" + r.stdout[-3000:]
    return r, float(m.group(1))


@pytest.mark.parametrize("mode,why", [
    ("past-end", "corrupted its request ring"),
    ("backwards", "corrupted its request ring"),
    ("no-drain", "does not drain its completion ring"),
])
def test_a_corrupting_rank_fails_the_job_naming_it(job, mode, why):
    r, attacked = run(job, mode)
    assert r.returncode != 0, r.stdout[-3000:]
    res = results(r.stdout)
    others = [x for x in range(4) if x != HOSTILE]
    assert all(x in res for x in others), "ranks without an error: %s\n%s" % (
        [x for x in others if x not in res], r.stdout[-3000:])
    for rank in others:
        at, msg = res[rank]
        assert f"rank {HOSTILE} {why}" in msg, (rank, msg)
        # no-drain: the daemon gives a full completion ring 5 s before it gives up on the rank.
        assert at - attacked < (10.0 if mode == "no-drain" else 5.0), (rank, at - attacked, msg)
    assert f"rank {HOSTILE} {why}" in r.stdout  # the daemon's log names it too
    if mode == "no-drain":
        # Hundreds of refused requests: ten warnings, then a count at the job's end.
        assert len(re.findall(rf"rank {HOSTILE}: invalid request", r.stdout)) <= 10, r.stdout[-3000:]
        m = re.search(rf"rank {HOSTILE} posted (\d+) invalid requests in all, 10 of them logged", r.stdout)
        assert m and int(m.group(1)) > 10, r.stdout[-3000:]


def test_random_descriptors_are_refused_and_the_job_goes_on(job):
    r, _ = run(job, "garbage")
    assert r.returncode == 0, r.stdout[-3000:]
    assert sorted(int(m) for m in re.findall(r"OK (\d+) 50$", r.stdout, re.M)) == [0, 1, 2, 3], r.stdout[-3000:]
    assert "invalid request" in r.stdout, "the daemon logged no refusal:\n" + r.stdout[-3000:]


def test_corrupting_rank_across_simulated_nodes(job):
    # The hostile rank is on node 0; ranks 2 and 3 on node 1 learn of it through the fabric.
    r, attacked = run(job, "past-end", nproc=2, extra=("--simulate-nodes", "2"))
    assert r.returncode != 0, r.stdout[-3000:]
    res = results(r.stdout)
    for rank in (0, 2, 3):
        at, msg = res[rank]
        assert f"rank {HOSTILE} corrupted its request ring" in msg, (rank, msg)
        assert at - attacked < 5.0, (rank, at - attacked)
