"""GPU path across nodes (label gpu): CUDA tensors in groups that span 2 simulated nodes (one
daemon per node, libfabric over loopback between them) are staged through the ranks' arenas
and the daemons' host path; every collective x dtype must match the reference (and NCCL, with a
GPU per rank). Skips without a GPU or without the fabric transport."""

import os

import pytest

from conftest import gpu_count, gpu_ranks, run_job

pytestmark = [
    pytest.mark.skipif(os.environ.get("SMDDP_HAVE_FABRIC", "ON").upper() in ("OFF", "0", "FALSE"),
                       reason="this smddp build has no libfabric transport (jobs across nodes need it)"),
]


@pytest.mark.skipif(gpu_count() < gpu_ranks(),
                    reason="needs %d CUDA GPUs (GPU tests skip on CPU machines)" % gpu_ranks())
def test_gpu_collectives_across_two_simulated_nodes():
    # The job's GPUs split over 2 simulated nodes (2 GPUs: one rank per node; 8: four), each
    # rank on GPU RANK; the world group spans both nodes.
    n = gpu_ranks()
    res = run_job("gpu_collectives_worker.py", n // 2, args=["--sizes", "1,7,1048579"], timeout=600,
                  smddprun_args=("--simulate-nodes", "2"), extra_env={"SMDDP_TEST_GPU_BY_RANK": "1"})
    res.assert_ok(min_checks=(n // 2 * 2) * 200)


@pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU (GPU tests skip on CPU machines)")
def test_gpu_collectives_across_two_simulated_nodes_sharing_one_gpu():
    # Across nodes CUDA tensors only cross the arena and the fabric, never another GPU: two
    # simulated nodes on one GPU check that path on a machine with one GPU (no NCCL, which
    # refuses ranks that share a GPU; the reference only).
    res = run_job("gpu_collectives_worker.py", 1, args=["--sizes", "1,7,1048579"], timeout=600,
                  smddprun_args=("--simulate-nodes", "2"),
                  extra_env={"SMDDP_TEST_GPU_BY_RANK": "1", "SMDDP_TEST_NO_NCCL": "1", "CUDA_VISIBLE_DEVICES": "0"})
    res.assert_ok(min_checks=2 * 200)
