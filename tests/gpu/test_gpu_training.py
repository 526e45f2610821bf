"""GPU path (label gpu): DDP (fp32, bf16 autocast), FSDP1 FULL_SHARD and FSDP2 fully_shard
give the same losses over smddp as over NCCL, launched with smddprun and with mpirun.
Skips cleanly where there are fewer than 2 GPUs."""

import pytest

from conftest import LAUNCHERS, gpu_ranks, run_job
from test_gpu_collectives import pytestmark  # noqa: F401 - the same skip condition


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_training_parity(launcher):
    n = gpu_ranks()
    res = run_job("gpu_training_worker.py", n, launcher=launcher, timeout=600)
    res.assert_ok(min_checks=n * 4)
