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
    res.assert_ok(min_checks=200)


@pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU (GPU tests skip on CPU machines)")
def test_gpu_collectives_across_two_simulated_nodes_sharing_one_gpu():
    # Across nodes CUDA tensors only cross the arena and the fabric, never another GPU: two
    # simulated nodes on one GPU check that path on a machine with one GPU (no NCCL, which
    # refuses ranks that share a GPU; the reference only).
    res = run_job("gpu_collectives_worker.py", 1, args=["--sizes", "1,7,1048579"], timeout=600,
                  smddprun_args=("--simulate-nodes", "2"),
                  extra_env={"SMDDP_TEST_GPU_BY_RANK": "1", "SMDDP_TEST_NO_NCCL": "1", "CUDA_VISIBLE_DEVICES": "0"})
    res.assert_ok(min_checks=200)


# Two simulated nodes of two ranks each, all four on GPU 0: the hierarchical path (a reduce-scatter
# or copies inside the node by CUDA IPC between the node's two ranks, each rank's shard across the
# nodes on its rail) runs on one GPU. SMDDP_HIER_MIN_BYTES=0 sends every size that way.
ONE_GPU_TWO_BY_TWO = {"SMDDP_TEST_GPU_BY_RANK": "1", "SMDDP_TEST_NO_NCCL": "1", "CUDA_VISIBLE_DEVICES": "0"}
one_gpu = pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU (GPU tests skip on CPU machines)")


@one_gpu
def test_gpu_hierarchical_collectives_two_nodes_of_two_ranks():
    # 0 elements goes the host way; 1 and 7 give ranks empty shards (their rails stay idle).
    res = run_job("gpu_collectives_worker.py", 2, args=["--sizes", "0,1,7,1048579"], timeout=900,
                  smddprun_args=("--simulate-nodes", "2"),
                  extra_env={**ONE_GPU_TWO_BY_TWO, "SMDDP_HIER_MIN_BYTES": "0"})
    res.assert_ok(min_checks=400)


@one_gpu
def test_gpu_hierarchical_collectives_64mi_elements():
    # Every dtype and op of the collectives with a hierarchical form at 64 Mi elements (the
    # default threshold: this size takes it anyway), pieces and many arena chunks per shard.
    res = run_job("gpu_collectives_worker.py", 2, args=["--sizes", str(64 << 20), "--hier-only"], timeout=1200,
                  smddprun_args=("--simulate-nodes", "2"), extra_env=ONE_GPU_TWO_BY_TWO)
    res.assert_ok(min_checks=80)


@one_gpu
def test_gpu_hierarchical_training_matches_one_node(tmp_path):
    # DDP and FSDP2 (also over an SMDATAPARALLEL_OPTIMIZE_SDP group): the same per-step losses
    # across 2 nodes x 2 ranks (hierarchically) as on one node of 4 ranks (the in-node path).
    import json
    env = {**ONE_GPU_TWO_BY_TWO, "SMDDP_HIER_MIN_BYTES": "0"}
    runs = {}
    for name, extra in (("across", ("--simulate-nodes", "2")), ("one_node", ())):
        out = tmp_path / (name + ".json")
        res = run_job("gpu_training_worker.py", 2 if extra else 4, timeout=900, smddprun_args=extra,
                      extra_env={**env, "SMDDP_TEST_LOSSES": str(out)})
        res.assert_ok(min_checks=3)
        runs[name] = json.loads(out.read_text())
    assert sorted(runs["across"]) == ["ddp", "fsdp2", "fsdp2_sdp"], runs["across"]
    for kind, a in runs["across"].items():
        b = runs["one_node"][kind]
        for step, (x, y) in enumerate(zip(a["losses"], b["losses"])):
            assert abs(x - y) <= 1e-5 * abs(y), "%s: step %d loss %r across nodes, %r on one node" % (kind, step, x, y)
        if a["params"] is not None:
            assert abs(a["params"] - b["params"]) <= 1e-5 * max(1.0, abs(b["params"])), (kind, a["params"], b["params"])


@one_gpu
@pytest.mark.parametrize("phase", ["before", "during", "after"])
@pytest.mark.parametrize("victim", [1, 2])
def test_gpu_hierarchical_rank_killed(victim, phase):
    # Rank 1 shares node 0 with rank 0; rank 2 is on node 1. Every survivor fails within a few
    # seconds naming the victim, its GPU drains, and nothing is left behind.
    import re
    job = run_job("gpu_fail_worker.py", 2, args=[victim, phase], timeout=240,
                  smddprun_args=("--simulate-nodes", "2"), extra_env=ONE_GPU_TWO_BY_TWO)
    assert job.returncode != 0, job.output[-3000:]
    m = re.search(r"^SMDDP-VICTIM (\d+) ([0-9.]+)$", job.records, re.M)
    assert m and int(m.group(1)) == victim, "the victim did not get to die\n" + job.output[-3000:]
    reports = {int(r): (cls, float(t), msg) for r, cls, t, msg in
               re.findall(r"^SMDDP-SURVIVOR (\d+) (\S+) ([0-9.]+) (.*)$", job.records, re.M)}
    assert sorted(reports) == [r for r in range(4) if r != victim], "survivor reports: %s\n%s" % (
        reports, job.output[-3000:])
    for r, (cls, t, msg) in reports.items():
        assert cls.startswith("SMDDP"), "rank %d raised %s: %s" % (r, cls, msg)
        assert re.search(r"\brank %d\b" % victim, msg), "rank %d's error does not name rank %d: %s" % (r, victim, msg)
        assert t - float(m.group(2)) < 10, "rank %d learned of the failure after %.1f s" % (r, t - float(m.group(2)))
    drained = set(int(r) for r in re.findall(r"^SMDDP-DRAINED (\d+)$", job.records, re.M))
    assert drained == set(reports), "GPUs left waiting: %s" % (set(reports) - drained)
    assert not job.leftovers()
