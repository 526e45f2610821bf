"""examples/train_ddp.py runs under smddprun and under plain mpirun, its loss falls and the
ranks end with the same parameters (DDP kept them in step)."""

import os
import re

import pytest

from conftest import LAUNCHERS, SOURCE_ROOT, run_job


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_train_ddp_example(launcher):
    job = run_job(os.path.join(SOURCE_ROOT, "examples", "train_ddp.py"), 2, args=["--steps", "10", "--device", "cpu"], launcher=launcher)
    assert job.returncode == 0, job.output[-3000:]
    losses = [float(m) for m in re.findall(r"step +\d+ +loss ([0-9.]+)", job.output)]
    assert len(losses) == 10 and losses[-1] < losses[0], losses
    assert "backend smddp" in job.output
    # Each rank trains on its own shard: only averaged gradients keep the models equal.
    # Not anchored at a line's start: mpirun's output forwarding can put another rank's line, cut
    # before its newline, in front of it ("step 9 loss 1.98rank 1 parameter checksum ...").
    sums = {int(r): s for r, s in re.findall(r"rank (\d+) parameter checksum ([0-9.e+-]+)$", job.output, re.M)}
    assert sorted(sums) == [0, 1], "checksum lines: %s\n%s" % (sums, job.output[-3000:])
    assert len(set(sums.values())) == 1, "the ranks' parameters differ: %s" % sums


def test_show_status_is_current():
    # What ./scripts/demo.sh prints: the status rank 0 asks for right after training must count
    # the collectives the job just ran (a status older than the job's few milliseconds of
    # training would show none).
    job = run_job(os.path.join(SOURCE_ROOT, "examples", "train_ddp.py"), 2,
                  args=["--steps", "10", "--device", "cpu", "--show-status"])
    assert job.returncode == 0, job.output[-3000:]
    m = re.search(r"collectives: +(\d+) done", job.output)
    assert m, job.output[-3000:]
    assert int(m.group(1)) >= 10, "status shows %s collectives after 10 DDP steps\n%s" % (m.group(1), job.output[-2000:])
    assert "smddp-ctl health exit status: 0" in job.output
