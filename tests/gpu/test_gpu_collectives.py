"""GPU path (label gpu): every collective x dtype on CUDA tensors against NCCL and a
reference, with and without the SDP AllGather path, through smddprun and mpirun (torchrun
is covered by scripts/bench_torch.py). Skips cleanly where there are fewer than 2 GPUs."""

import pytest

from conftest import LAUNCHERS, gpu_count, gpu_ranks, run_job

pytestmark = pytest.mark.skipif(gpu_count() < gpu_ranks(),
                                reason="needs %d CUDA GPUs (GPU tests skip on CPU machines)" % gpu_ranks())


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_gpu_collectives(launcher):
    n = gpu_ranks()
    res = run_job("gpu_collectives_worker.py", n, args=["--big"] if launcher == "smddprun" else [],
                  launcher=launcher, timeout=600)
    res.assert_ok(min_checks=400)


def test_gpu_expandable_segments():
    # 4 Mi + 7 float32 (16 MiB + 28 B) takes the plan path, through the staging buffers.
    n = gpu_ranks()
    res = run_job("gpu_collectives_worker.py", n, args=["--sizes", "7,1048579,4194311"], timeout=600,
                  extra_env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    res.assert_ok(min_checks=200)


def test_gpu_daemon_exec():
    # SMDDP_GPU_EXEC=daemon: the daemon runs every kernel and copy itself (the first design,
    # docs/design.md). The idle uneven-AllToAll rank included.
    n = gpu_ranks()
    res = run_job("gpu_collectives_worker.py", n, args=["--sizes", "7,1048579,4194311"], timeout=600,
                  extra_env={"SMDDP_GPU_EXEC": "daemon"})
    res.assert_ok(min_checks=200)


@pytest.mark.parametrize("form", [{}, {"SMDDP_COPY_DIRECTION": "pull"}, {"SMDDP_TWOSHOT": "pull"},
                                  {"SMDDP_TWOSHOT": "kernel"}],
                         ids=["plan-only", "gather-pull", "twoshot-pull", "twoshot-kernel"])
def test_gpu_other_forms(form):
    # The plan path at every size (the fast path off), in the default form and in those that
    # are not (AllGather and AllToAll reading the peers; the two-shot AllReduce's copies
    # reading, or its kernel writing into every output).
    n = gpu_ranks()
    res = run_job("gpu_collectives_worker.py", n, args=["--sizes", "7,1048579,3145739"], timeout=600,
                  extra_env=dict(form, SMDDP_FAST_MAX_BYTES="0"))
    res.assert_ok(min_checks=300)


@pytest.mark.parametrize("other", [16, 1 << 23])
def test_gpu_fast_path_disagreement(other):
    # Rank 0 takes the fast path, rank 1 another fast size or the plan path: errors, no hang.
    res = run_job("gpu_fast_failure_worker.py", 2, args=[other], timeout=240)
    assert len(res.checks) == 2 and not res.failures(), res.output[-3000:]
