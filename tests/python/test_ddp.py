"""DDP on smddp equals DDP on gloo and a single-process full-batch reference, with 2 and 4
ranks, through smddprun and through plain mpirun."""

import pytest

from conftest import LAUNCHERS, run_job

CASES = ("plain", "no_sync", "find_unused_parameters", "gradient_as_bucket_view", "fp16_compress_hook",
         "broadcast_buffers")


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_ddp_matches_gloo_and_reference(launcher, nproc):
    job = run_job("ddp_worker.py", nproc, launcher=launcher)
    job.assert_ok(min_checks=8)
    for name in CASES:
        assert "ddp." + name in job.names(0), name
