"""Every collective x dtype of the smddp backend against gloo and computed references, with 2
and 4 ranks, launched through smddprun (path 1) and through plain mpirun (path 2)."""

import pytest

from conftest import LAUNCHERS, run_job

FAMILIES = ["allreduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
            "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "gather", "scatter", "send_recv",
            "isend_irecv", "batch_isend_irecv"]
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool")


@pytest.fixture(scope="module", params=[(l, n) for l in LAUNCHERS for n in (2, 4)],
                ids=lambda p: "%s-%dranks" % p)
def job(request):
    launcher, nproc = request.param
    return run_job("collectives_worker.py", nproc, launcher=launcher), nproc


def test_all_checks_pass(job):
    res, nproc = job
    res.assert_ok(min_checks=150)


def test_every_family_covers_every_dtype(job):
    res, _ = job
    names = res.names(0)
    missing = [(f, d) for f in FAMILIES for d in DTYPES
               if not any(n.startswith(f + ".") and n.endswith("." + d) for n in names)]
    assert not missing, missing


def test_object_collectives_ran(job):
    res, _ = job
    assert "objects" in res.names(0)
