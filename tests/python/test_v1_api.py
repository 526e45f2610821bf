"""The smdistributed v1 API (smdistributed.dataparallel.torch.distributed + parallel DDP)."""

from conftest import run_job


def test_v1_api_trains():
    job = run_job("v1_api_worker.py", 2)
    job.assert_ok(min_checks=4)
    assert "v1 step 19 loss" in job.output
