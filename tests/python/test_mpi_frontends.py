"""Training front-ends that look at MPI, with the smddp backend, and no ssh or rsh on PATH.

Lightning's cluster detection and DeepSpeed's init_distributed (with its MPI discovery) are
reproduced by workers/mpi_frontends_worker.py from their public behaviour (neither can be
installed here). Under smddprun a rank's MPI is an isolated singleton (COMM_WORLD: rank 0 of 1):
front-ends that take rank and size from the environment work, and a rank and size taken from
COMM_WORLD are refused with an error that says so. Under plain mpirun the ranks are the MPI job,
and MPI discovery gives the real world.

mpi4py comes from Debian's python3-mpi4py (scripts/setup.sh installs it): missing under Debian's
python3 is a failure; another interpreter that lacks it skips (ctest shows the skip).
"""
import os
import sys

import pytest

from conftest import free_port, python_exe, run_job

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import mpi_without_ssh  # noqa: E402  (tests/mpi_without_ssh.py)

WORKER = "mpi_frontends_worker.py"
SINGLETON_HINT = "MPI.COMM_WORLD is a singleton (rank 0, size 1)"


@pytest.fixture(autouse=True)
def mpi4py_present():
    mpi_without_ssh.require_mpi4py(python_exe())


@pytest.fixture
def no_ssh(tmp_path):
    """extra_env for run_job: a PATH with python3 and mpirun only."""
    return {"PATH": mpi_without_ssh.path_without_ssh(tmp_path / "bin", python_exe())}


# --noprefix: Open MPI otherwise puts its own prefix's bin folder (/usr/bin, where Debian's ssh
# lives) first on the ranks' PATH; without it they keep the ssh-free PATH, as on a host without
# ssh. Plain mpirun there also needs the isolated launcher (smddprun adds it itself).
NOPREFIX = ("--custom-mpi-options", "--noprefix")
MPIRUN_NO_SSH = ("--noprefix", "--mca", "plm", "isolated")
SIMULATED = {"one node": NOPREFIX, "2 simulated nodes": NOPREFIX + ("--simulate-nodes", "2")}


def detail(job, rank, name):
    ok, text = job.checks.get((rank, name), (None, "(not reported)"))
    return text


@pytest.mark.parametrize("layout", SIMULATED)
def test_lightning_detection_then_smddp_under_smddprun(no_ssh, layout):
    # MPIEnvironment.detect() reads COMM_WORLD (size 1: no); TorchElasticEnvironment takes
    # RANK/WORLD_SIZE from smddprun's environment; the all_reduce spans the whole job.
    job = run_job(WORKER, 2, args=("lightning", "ok"), extra_env=no_ssh, smddprun_args=SIMULATED[layout])
    job.assert_ok(min_checks=5)
    world = 4 if layout == "2 simulated nodes" else 2
    for r in range(world):
        assert detail(job, r, "environment") == "TorchElasticEnvironment", job.checks
        assert detail(job, r, "world_size") == str(world), job.checks


def test_lightning_detection_under_plain_mpirun(no_ssh):
    # Launch path 2: the ranks are the MPI job, so MPIEnvironment is the one detected.
    job = run_job(WORKER, 2, args=("lightning", "ok"), extra_env=no_ssh, launcher="mpirun",
                  mpirun_args=MPIRUN_NO_SSH)
    job.assert_ok(min_checks=5)
    for r in range(2):
        assert detail(job, r, "environment") == "MPIEnvironment", job.checks


@pytest.mark.parametrize("layout", SIMULATED)
def test_hf_trainer_sagemaker_dp_under_python_m_mpi4py(no_ssh, layout):
    # SageMaker's launch line runs the script as `python -m mpi4py train.py`; the Trainer's
    # SageMaker-DP path then initialises "smddp" and takes its device from SMDATAPARALLEL_LOCAL_RANK.
    env = dict(no_ssh, SM_FRAMEWORK_PARAMS='{"sagemaker_distributed_dataparallel_enabled": true}')
    job = run_job(WORKER, 2, args=("hf-sagemaker-dp", "ok"), extra_env=env, smddprun_args=SIMULATED[layout],
                  python_args=("-m", "mpi4py"))
    job.assert_ok(min_checks=6)
    world = 4 if layout == "2 simulated nodes" else 2
    assert all(detail(job, r, "world_size") == str(world) for r in range(world)), job.checks


def check_refused(job, world, wants):
    """Every rank's init_process_group raised (none hung: the job ended within its time), the job
    failed, and at least one rank got smddp's error containing every string of `wants`."""
    tail = "\n".join(job.output.splitlines()[-40:])
    assert job.returncode != 0, "the job succeeded\n" + tail
    assert job.elapsed < 90, "the job took %.0f s to fail" % job.elapsed
    raised = {r: detail(job, r, "init_raised") for r in range(world)}
    assert all(job.checks.get((r, "init_raised"), (False,))[0] for r in range(world)), raised
    assert any(all(w in text for w in wants) for text in raised.values()), raised
    return raised


def test_rank_and_size_from_comm_world_are_refused_under_smddprun(no_ssh):
    # A script that passes COMM_WORLD's rank and size (Lightning with MPIEnvironment forced) asks
    # for rank 0 of 1 on every rank; each rank rendezvous alone, then smddp refuses the world. A
    # rank that reaches smddp only after a refused rank's exit has failed the job gets the failed
    # daemon's error instead, which names that exit.
    job = run_job(WORKER, 2, args=("lightning-mpi-env", "refused"), extra_env=no_ssh, smddprun_args=NOPREFIX)
    raised = check_refused(job, 2, ["rank 0 of world size 1 disagrees with the smddp job"])
    for r, text in raised.items():
        if "disagrees with the smddp job" in text:
            assert "SMDDPInvalidArgumentError" in text, raised
            assert "rank 0 of world size 1 disagrees with the smddp job" in text, raised
            assert "this process is rank %d of 2" % r in text, raised
            assert SINGLETON_HINT in text and "plain `mpirun" in text, raised
        else:
            assert "is no longer serving" in text and "exited with status 1" in text, raised


@pytest.mark.parametrize("layout", SIMULATED)
def test_deepspeed_init_with_launch_variables_skips_discovery(no_ssh, layout):
    job = run_job(WORKER, 2, args=("deepspeed-keep", "ok", free_port()), extra_env=no_ssh,
                  smddprun_args=SIMULATED[layout])
    job.assert_ok(min_checks=5)
    assert ("discovery_skipped" in job.names(0)) and ("discovery_runs" not in job.names(0)), job.checks


def test_deepspeed_discovery_under_smddprun_is_refused_not_hung(no_ssh):
    # Without the launch variables DeepSpeed's mpi_discovery sets RANK=0 WORLD_SIZE=1 on every
    # rank, and every rank starts an env:// store on the discovered port. A rank that binds it
    # reaches smddp, which refuses it naming the mismatch and the singleton; another fails at that
    # bind (address in use) or, once the refused rank's exit has failed the job and freed the
    # port, at attaching to the job's failed daemon, which names that exit.
    job = run_job(WORKER, 2, args=("deepspeed-unset", "refused", free_port()), extra_env=no_ssh,
                  smddprun_args=NOPREFIX)
    raised = check_refused(job, 2, ["WORLD_SIZE is 1 but the job has 2 ranks", SINGLETON_HINT,
                                    "SMDDPInvalidArgumentError"])
    for text in raised.values():
        assert (SINGLETON_HINT in text or "address already in use" in text.lower()
                or ("is no longer serving" in text and "exited with status 1" in text)), raised
    for r in range(2):
        assert "RANK=0 WORLD_SIZE=1" in detail(job, r, "discovered"), job.checks


def test_deepspeed_discovery_under_plain_mpirun(no_ssh):
    # Launch path 2: COMM_WORLD is the job, so discovery fills the real rank and size.
    job = run_job(WORKER, 2, args=("deepspeed-unset", "ok", free_port()), extra_env=no_ssh, launcher="mpirun",
                  mpirun_args=MPIRUN_NO_SSH)
    job.assert_ok(min_checks=6)
    for r in range(2):
        assert "RANK=%d WORLD_SIZE=2" % r in detail(job, r, "discovered"), job.checks
