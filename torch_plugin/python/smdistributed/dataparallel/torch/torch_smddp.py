"""Importing this module registers the c10d backend ``"smddp"`` with torch.distributed::

    import smdistributed.dataparallel.torch.torch_smddp
    torch.distributed.init_process_group(backend="smddp")

Registration is idempotent (importing the module again, or under another name, is harmless).
"""

import atexit
import inspect
import sys

import torch
import torch.distributed as dist

from smdistributed.dataparallel.torch import _launch
from smdistributed.dataparallel.exceptions import SMDDPError

BACKEND_NAME = "smddp"

# Fill RANK/WORLD_SIZE/... from mpirun and friends before the user's init_process_group reads them.
_launch.map_launcher_env()


def _load_extension():
    try:
        from smdistributed.dataparallel.torch import _smddp_c
    except ImportError as e:
        raise SMDDPError(
            "smddp: the C++ extension _smddp_c could not be loaded (%s). It is built by the smddp "
            "CMake project (target smddp_torch_plugin) for torch %s; put <build>/python on "
            "PYTHONPATH." % (e, torch.__version__)
        ) from e
    return _smddp_c


def _create_backend(dist_backend_opts, pg_options=None):
    """The creator torch.distributed calls (extended API) for each smddp group."""
    ext = _load_extension()
    global_ranks = list(dist_backend_opts.global_ranks_in_group)
    if not global_ranks:
        # The default group: the first one a job creates, so the place to get a daemon going.
        _launch.ensure_daemon(dist_backend_opts.store, dist_backend_opts.group_rank, dist_backend_opts.group_size)
    timeout = dist_backend_opts.timeout
    timeout_s = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    pg = ext.create_process_group(
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        timeout_s,
        str(dist_backend_opts.group_id),
        global_ranks,
    )
    if not global_ranks:
        # Keeps the process attached to its daemon across destroy_process_group(): a rank
        # cannot register with a daemon again once it detached, so a later
        # init_process_group reuses this attachment. Released when the interpreter exits.
        global _world_keepalive
        _world_keepalive = pg
    return pg


_world_keepalive = None


def _detach_at_exit():
    # torch 2.x keeps every process group (and so our client) alive until the process ends,
    # without destroying it: say goodbye to the daemon here so it sees a clean exit, not a
    # rank that vanished.
    ext = sys.modules.get("smdistributed.dataparallel.torch._smddp_c")
    if ext is not None:
        ext._detach_at_exit()


def _register():
    plugins = getattr(dist.Backend, "_plugins", {})
    if BACKEND_NAME.upper() in plugins:
        return
    params = inspect.signature(dist.Backend.register_backend).parameters
    kwargs = {"extended_api": True}
    if "devices" in params:
        # A list, never a string (2.x iterates a string char by char). Without "cpu" object
        # collectives and barrier() fail.
        kwargs["devices"] = ["cpu", "cuda"]
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, **kwargs)


_register()
atexit.register(_detach_at_exit)
