"""How a rank finds its environment and its node's smddp daemon.

Launch path 1, ``smddprun ... -- python train.py``: the daemon spawned this process and set
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, SMDDP_JOB_ID and
SMDDP_NODE_ID. Nothing to do.

Launch path 2, plain ``mpirun -np N python train.py`` or torchrun: the ranks start first.
:func:`map_launcher_env` fills RANK/... from what the launcher set (Open MPI, PMI, Slurm) so
``init_process_group``'s default ``env://`` works, and :func:`ensure_daemon` gets a daemon
started (local rank 0 runs ``smddp-daemon --attach-mode``).
"""

import os

from smdistributed.dataparallel.exceptions import SMDDPDaemonUnreachableError

# (variable torch reads, sources in order of preference)
_ENV_SOURCES = (
    ("RANK", ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")),
    ("WORLD_SIZE", ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")),
    ("LOCAL_RANK", ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")),
    ("LOCAL_WORLD_SIZE", ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")),
)

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = "29500"


def map_launcher_env(environ=None):
    """Sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from
    the launcher's variables where they are missing. Returns the names it set."""
    env = os.environ if environ is None else environ
    set_names = []
    for name, sources in _ENV_SOURCES:
        if name in env:
            continue
        for src in sources:
            if src in env:
                env[name] = env[src]
                set_names.append(name)
                break
    if "RANK" in env and "WORLD_SIZE" in env:
        # A single-node default; multi-node mpirun jobs must export MASTER_ADDR themselves.
        if "MASTER_ADDR" not in env:
            env["MASTER_ADDR"] = DEFAULT_MASTER_ADDR
            set_names.append("MASTER_ADDR")
        if "MASTER_PORT" not in env:
            env["MASTER_PORT"] = DEFAULT_MASTER_PORT
            set_names.append("MASTER_PORT")
    if "LOCAL_RANK" in env and "SMDATAPARALLEL_LOCAL_RANK" not in env:
        # Hugging Face Transformers' SageMaker path reads this one.
        env["SMDATAPARALLEL_LOCAL_RANK"] = env["LOCAL_RANK"]
    return set_names


def launched_by_smddprun(environ=None):
    env = os.environ if environ is None else environ
    return "SMDDP_JOB_ID" in env


def ensure_daemon(store, rank, world_size):
    """Makes sure this rank's node has a daemon for the job before the backend attaches.

    Called once, for the default group, with the Store that init_process_group created.
    """
    if launched_by_smddprun():
        return
    start_attach_mode_daemon(store, rank, world_size)


def start_attach_mode_daemon(store, rank, world_size):
    """Launch path 2: local rank 0 of each node starts ``smddp-daemon --attach-mode`` and the
    daemons bootstrap through ``store``; every rank then learns SMDDP_JOB_ID/SMDDP_NODE_ID.

    The daemon side of attach mode is not defined yet, so for now this explains how to start
    the job instead.
    """
    raise SMDDPDaemonUnreachableError(
        "smddp: no smddp daemon for this job (SMDDP_JOB_ID is not set) on rank %d of %d. "
        "Start the job with `smddprun --nproc-per-node N -- python train.py` (one daemon per "
        "node, which spawns the ranks). Starting a daemon from plain `mpirun -np N python "
        "train.py` or torchrun (smddp-daemon --attach-mode) is not available in this build yet."
        % (rank, world_size)
    )
