"""DDP on smddp equals DDP on gloo and a single-process full-batch reference (2 ranks)."""

from conftest import run_job


def test_ddp_matches_gloo_and_reference():
    job = run_job("ddp_worker.py", 2)
    job.assert_ok(min_checks=2 * 8)
    for name in ("plain", "no_sync", "find_unused_parameters", "gradient_as_bucket_view", "fp16_compress_hook",
                 "broadcast_buffers"):
        assert "ddp." + name in job.names(0), name
