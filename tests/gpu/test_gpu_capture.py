"""CUDA graph capture beside smddp (label gpu): a collective called inside a capture fails at
once with a clear error on every rank and the group goes on; smddp's own threads do not break
a capture of the model's kernels while its collectives are under way. Skips cleanly where
there are fewer than 2 GPUs (the world of one rank: without a GPU)."""

import os

import pytest

from conftest import gpu_count, gpu_ranks, run_job


@pytest.mark.skipif(gpu_count() < gpu_ranks(),
                    reason="needs %d CUDA GPUs (GPU tests skip on CPU machines)" % gpu_ranks())
@pytest.mark.parametrize("exec_mode", ["rank", "daemon"])
def test_gpu_cuda_graph_capture(exec_mode):
    # 6 collectives and barrier x 3 capture modes at 8 elements, the 6 on the plan path in
    # global mode, and the capture beside collectives in flight: 28 checks per rank.
    n = gpu_ranks()
    extra = {k: os.environ[k] for k in ("SMDDP_TEST_STACKS_AFTER",) if os.environ.get(k)}
    res = run_job("gpu_capture_worker.py", n, timeout=200, extra_env=dict(extra, SMDDP_GPU_EXEC=exec_mode))
    res.assert_ok(min_checks=28)


@pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU (GPU tests skip on CPU machines)")
def test_gpu_cuda_graph_capture_world_of_one():
    # The same checks on a machine with one GPU: a world of one rank issues no peer work, but the
    # refusals, and the group's calls after them, take the same path.
    extra = {k: os.environ[k] for k in ("SMDDP_TEST_STACKS_AFTER",) if os.environ.get(k)}
    res = run_job("gpu_capture_worker.py", 1, timeout=200, extra_env=extra)
    res.assert_ok(min_checks=28)
