"""new_group([0, 2]) and new_group([1, 3]) with smddp among 4 ranks, beside gloo, through
smddprun and through plain mpirun (where subgroups reuse the job id the world group agreed on)."""

import pytest

from conftest import LAUNCHERS, run_job


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_subgroups(launcher):
    run_job("subgroup_worker.py", 4, launcher=launcher).assert_ok(min_checks=6)
