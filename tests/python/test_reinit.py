"""init_process_group after destroy_process_group, through smddprun and plain mpirun: the rank
stays attached to its daemon and every init works; no daemon or segment is left behind."""

import pytest

from conftest import LAUNCHERS, run_job


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_reinit(launcher):
    job = run_job("reinit_worker.py", 2, launcher=launcher, timeout=120)
    job.assert_ok(min_checks=6)
