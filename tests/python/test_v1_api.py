"""The smdistributed v1 API (smdistributed.dataparallel.torch.distributed + parallel DDP), end
to end with 2 and 4 ranks, through smddprun and through plain mpirun."""

import pytest

from conftest import LAUNCHERS, run_job


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_v1_api_trains(launcher, nproc):
    job = run_job("v1_api_worker.py", nproc, launcher=launcher)
    job.assert_ok(min_checks=2)
    assert "v1 step 19 loss" in job.output
