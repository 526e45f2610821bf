"""Every collective x dtype of the smddp backend against gloo and computed references (3 ranks)."""

import pytest

from conftest import run_job


@pytest.fixture(scope="module")
def job():
    return run_job("collectives_worker.py", 3)


def test_all_checks_pass(job):
    job.assert_ok(min_checks=3 * 150)


@pytest.mark.parametrize("family", ["allreduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                                    "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "all_to_all",
                                    "gather", "scatter", "send_recv", "isend_irecv"])
def test_family_covers_every_dtype(job, family):
    names = job.names(0)
    for dtype in ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"):
        assert any(n.startswith(family + ".") and n.endswith("." + dtype) for n in names), (family, dtype)
