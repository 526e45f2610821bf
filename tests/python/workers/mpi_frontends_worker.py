"""Stand-ins for how training front-ends that look at MPI start a job, run by test_mpi_frontends.py.
Hugging Face Transformers, Lightning and DeepSpeed cannot be installed here, so their public
start-up sequences are reproduced (names follow theirs); each mode then checks an all_reduce.

  lightning            Lightning's cluster detection: MPIEnvironment.detect() (mpi4py importable
                       and COMM_WORLD.Get_size() > 1), the environments in Lightning's order
                       (SLURM, TorchElastic, Kubeflow, LSF, MPI, else LightningEnvironment), then
                       _init_dist_connection: MASTER_ADDR/PORT from the environment and
                       init_process_group("smddp", rank=global_rank(), world_size=world_size()).
  lightning-mpi-env    the same with MPIEnvironment forced (a script that passes COMM_WORLD's rank
                       and size to init_process_group): under smddprun it must be refused, naming
                       the cause.
  deepspeed-keep       deepspeed.init_distributed("smddp"): the launch variables are all set, so
                       mpi_discovery is skipped.
  deepspeed-unset      the same with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK deleted
                       first: mpi_discovery fills them from COMM_WORLD.
  hf-sagemaker-dp      Hugging Face Trainer in SageMaker-DP mode (transformers'
                       is_sagemaker_dp_enabled(): SM_FRAMEWORK_PARAMS enables it and the
                       smdistributed package exists), then init_process_group(backend="smddp")
                       and the local rank from SMDATAPARALLEL_LOCAL_RANK; the test runs it as
                       SageMaker's launch line does, `python -m mpi4py`.

Under plain mpirun, "lightning" finds MPIEnvironment (the ranks are the MPI job) and
"deepspeed-unset" discovers the real world.

Argument 2: "ok" (init and the all_reduce must work) or "refused" (init_process_group must raise
the error that names the mismatch and says where it comes from; the rank then exits non-zero,
as an uncaught exception would end it). Argument 3: DeepSpeed's distributed_port.
"""
import os
import shutil
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  (registers "smddp")
from smdistributed.dataparallel.torch import _launch
from common import Checker, announce

MODE, EXPECT = sys.argv[1], sys.argv[2]
PORT = int(sys.argv[3]) if len(sys.argv) > 3 else 29500
UNDER_SMDDPRUN = _launch.launched_by_smddprun()
# Whose rank this process is, for the records: the launcher's view, before anything rewrites it.
LAUNCH_RANK = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
# The tests stay on loopback: where Lightning uses the host name and DeepSpeed the first address
# of `hostname -I`, the stand-ins use this one.
LOOPBACK = "127.0.0.1"


# --- Lightning (lightning.fabric.plugins.environments, trainer/connectors) -----------------

class TorchElasticEnvironment:
    @staticmethod
    def detect():
        return {"RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}.issubset(os.environ)

    main_address = property(lambda self: os.environ["MASTER_ADDR"])
    main_port = property(lambda self: int(os.environ["MASTER_PORT"]))

    def world_size(self):
        return int(os.environ["WORLD_SIZE"])

    def global_rank(self):
        return int(os.environ["RANK"])


class MPIEnvironment:
    @staticmethod
    def detect():
        try:
            from mpi4py import MPI
        except ImportError:
            return False
        return MPI.COMM_WORLD.Get_size() > 1

    def __init__(self):
        from mpi4py import MPI
        self._comm = MPI.COMM_WORLD
        # Rank 0 of COMM_WORLD picks the address and a free port; everyone takes them by bcast.
        addr_port = None
        if self._comm.Get_rank() == 0:
            import socket
            with socket.socket() as s:
                s.bind((LOOPBACK, 0))
                addr_port = (LOOPBACK, s.getsockname()[1])
        self.main_address, self.main_port = self._comm.bcast(addr_port, root=0)

    def world_size(self):
        return self._comm.Get_size()

    def global_rank(self):
        return self._comm.Get_rank()


def lightning_choose_environment(force_mpi):
    if force_mpi:
        return MPIEnvironment()
    if "SLURM_NTASKS" in os.environ:
        raise RuntimeError("not under SLURM here")
    for env_type in (TorchElasticEnvironment, MPIEnvironment):  # Kubeflow and LSF need their variables
        if env_type.detect():
            return env_type()
    raise RuntimeError("LightningEnvironment: the stand-in covers launched jobs only")


def lightning_init(chk, force_mpi):
    # The MPI probe itself must not abort. Under smddprun COMM_WORLD is a singleton, so it says
    # no; under plain mpirun the ranks are the MPI job.
    detected = MPIEnvironment.detect()
    chk.report("mpi_detect", detected is (not UNDER_SMDDPRUN),
               "MPIEnvironment.detect() = %r, under smddprun: %r" % (detected, UNDER_SMDDPRUN))
    env = lightning_choose_environment(force_mpi)
    chk.report("environment", True, type(env).__name__)
    os.environ["MASTER_ADDR"] = env.main_address
    os.environ["MASTER_PORT"] = str(env.main_port)
    dist.init_process_group("smddp", rank=env.global_rank(), world_size=env.world_size())


# --- DeepSpeed (deepspeed/comm/comm.py) --------------------------------------------------

REQUIRED_ENV = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"]


def mpi_discovery(distributed_port):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    world_size = comm.Get_size()
    master_addr = LOOPBACK if rank == 0 else None
    master_addr = comm.bcast(master_addr, root=0)
    proc_name = MPI.Get_processor_name()
    all_procs = comm.allgather(proc_name)
    local_rank = sum([i == proc_name for i in all_procs[:rank]])
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["LOCAL_RANK"] = str(local_rank)
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(distributed_port)


def in_aws_sm():
    return "SM_TRAINING_ENV" in os.environ


def deepspeed_init_distributed(chk, dist_backend, distributed_port):
    if dist.is_initialized():
        return
    if not all(v in os.environ for v in REQUIRED_ENV):
        chk.report("discovery_runs", True, "launch variables missing: %s"
                   % [v for v in REQUIRED_ENV if v not in os.environ])
        if in_aws_sm():
            raise RuntimeError("SageMaker's OMPI_* path is not taken here")
        mpi_discovery(distributed_port)
        chk.report("discovered", True, " ".join("%s=%s" % (v, os.environ[v]) for v in REQUIRED_ENV))
    else:
        chk.report("discovery_skipped", "mpi4py" not in sys.modules, "mpi4py was imported")
    dist.init_process_group(dist_backend, timeout=timedelta(minutes=10), init_method=None, rank=-1, world_size=-1)


# --- Hugging Face Transformers (utils/import_utils.py, training_args.py) -----------------

def is_sagemaker_dp_enabled():
    import importlib.util
    import json
    try:
        params = json.loads(os.getenv("SM_FRAMEWORK_PARAMS", "{}"))
    except json.JSONDecodeError:
        return False
    if not params.get("sagemaker_distributed_dataparallel_enabled", False):
        return False
    return importlib.util.find_spec("smdistributed") is not None


def hf_setup_devices(chk):
    chk.report("sagemaker_dp_enabled", is_sagemaker_dp_enabled(), os.getenv("SM_FRAMEWORK_PARAMS", ""))
    chk.report("run_by_mpi4py", "mpi4py.run" in sys.modules, "not started as python -m mpi4py")
    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401,F811
    dist.init_process_group(backend="smddp", timeout=timedelta(seconds=1800))
    local_rank = int(os.getenv("SMDATAPARALLEL_LOCAL_RANK"))
    chk.report("local_rank", local_rank == int(os.environ["LOCAL_RANK"]),
               "SMDATAPARALLEL_LOCAL_RANK %d, LOCAL_RANK %s" % (local_rank, os.environ["LOCAL_RANK"]))


# --- the run -----------------------------------------------------------------------------

def init(chk):
    if MODE in ("lightning", "lightning-mpi-env"):
        lightning_init(chk, force_mpi=MODE == "lightning-mpi-env")
    elif MODE == "hf-sagemaker-dp":
        hf_setup_devices(chk)
    elif MODE in ("deepspeed-keep", "deepspeed-unset"):
        if MODE == "deepspeed-unset":
            for v in REQUIRED_ENV:
                os.environ.pop(v, None)
        deepspeed_init_distributed(chk, "smddp", PORT)
    else:
        raise ValueError(MODE)


def main():
    torch.set_num_threads(1)
    chk = Checker(LAUNCH_RANK)
    chk.report("no_ssh_on_path", shutil.which("ssh") is None and shutil.which("rsh") is None,
               "ssh=%s rsh=%s" % (shutil.which("ssh"), shutil.which("rsh")))
    if EXPECT == "refused":
        try:
            init(chk)
        except Exception as e:  # noqa: BLE001 - what it raised is the result, checked by the test
            chk.report("init_raised", True, "%s: %s" % (type(e).__name__, e))
            chk.finish()
            return 1  # an uncaught exception would end the rank so
        chk.report("init_raised", False, "init_process_group succeeded with rank %d of %d"
                   % (dist.get_rank(), dist.get_world_size()))
        return chk.finish()
    init(chk)
    announce(dist.get_rank())
    rank, world = dist.get_rank(), dist.get_world_size()
    chk.report("rank_is_the_launchers", rank == LAUNCH_RANK, "rank %d, launcher's %d" % (rank, LAUNCH_RANK))
    chk.report("world_size", True, str(world))
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    want = float(world * (world + 1) // 2)
    chk.report("allreduce_sum", bool(torch.all(t == want)), "got %s, want %s" % (t.tolist(), want))
    dist.destroy_process_group()
    return chk.finish()


if __name__ == "__main__":
    sys.exit(main())
