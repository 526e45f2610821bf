"""GPU path (label gpu): DDP (fp32, bf16 autocast), FSDP1 FULL_SHARD and FSDP2 fully_shard
give the same losses over smddp as over NCCL, launched with smddprun, torchrun and mpirun;
FSDP1 and FSDP2 also over a group with SMDATAPARALLEL_OPTIMIZE_SDP=true.
Skips cleanly where there are fewer than 2 GPUs."""

import os

import pytest

from conftest import LAUNCHERS, gpu_ranks, run_job
from test_gpu_collectives import pytestmark  # noqa: F401 - the same skip condition


@pytest.mark.parametrize("launcher", (*LAUNCHERS, "torchrun"))
def test_training_parity(launcher):
    n = gpu_ranks()
    # SMDDP_TEST_STACKS_AFTER=S: each rank prints its Python stacks after S seconds (a hang's place).
    extra = {k: os.environ[k] for k in ("SMDDP_TEST_STACKS_AFTER",) if os.environ.get(k)}
    res = run_job("gpu_training_worker.py", n, launcher=launcher, timeout=600, extra_env=extra)
    res.assert_ok(min_checks=6)
