"""new_group([0, 2]) and new_group([1, 3]) with smddp among 4 ranks, beside gloo."""

from conftest import run_job


def test_subgroups():
    run_job("subgroup_worker.py", 4).assert_ok(min_checks=4 * 6)
