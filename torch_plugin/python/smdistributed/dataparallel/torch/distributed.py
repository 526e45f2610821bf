"""The smdistributed v1 API (``smdistributed.dataparallel.torch.distributed``), kept so that
old SageMaker scripts run unchanged::

    import smdistributed.dataparallel.torch.distributed as dist
    dist.init_process_group()
    dist.all_reduce(t, op=dist.ReduceOp.AVERAGE)

It is a thin layer over torch.distributed with the ``smddp`` backend.
"""

import os

import torch.distributed as _tdist

from smdistributed.dataparallel.torch import torch_smddp as _torch_smddp  # registers "smddp"
from smdistributed.dataparallel.torch import _launch
from smdistributed.dataparallel.exceptions import SMDDPError, SMDDPInvalidArgumentError


class ReduceOp:
    """Reduce ops of the v1 API (AVERAGE is torch's AVG)."""

    SUM = _tdist.ReduceOp.SUM
    AVERAGE = _tdist.ReduceOp.AVG
    AVG = _tdist.ReduceOp.AVG
    MIN = _tdist.ReduceOp.MIN
    MAX = _tdist.ReduceOp.MAX
    PRODUCT = _tdist.ReduceOp.PRODUCT


group = _tdist.group


def is_available():
    return _tdist.is_available()


def init_process_group(*args, **kwargs):
    """torch.distributed.init_process_group with backend "smddp" (idempotent)."""
    backend = kwargs.pop("backend", None)
    if args:
        backend, args = args[0], args[1:]
    if backend not in (None, _torch_smddp.BACKEND_NAME):
        raise SMDDPInvalidArgumentError(
            "smdistributed.dataparallel.torch.distributed.init_process_group only runs the smddp "
            "backend (got backend=%r); use torch.distributed for others" % (backend,)
        )
    if _tdist.is_initialized():
        return
    _launch.map_launcher_env()
    _tdist.init_process_group(_torch_smddp.BACKEND_NAME, *args, **kwargs)


def is_initialized():
    return _tdist.is_initialized()


def _require_init():
    if not _tdist.is_initialized():
        raise SMDDPError(
            "smddp: the process group is not initialized; call "
            "smdistributed.dataparallel.torch.distributed.init_process_group() first"
        )


def get_rank(group=None):
    _require_init()
    return _tdist.get_rank(group) if group is not None else _tdist.get_rank()


def get_world_size(group=None):
    _require_init()
    return _tdist.get_world_size(group) if group is not None else _tdist.get_world_size()


def get_local_rank():
    """This rank's index on its node."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    _require_init()
    return _info()["local_rank"]


def get_local_size():
    """Number of ranks on this node."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    _require_init()
    return _info()["local_world_size"]


def _info():
    info = _torch_smddp._load_extension().client_info()
    if info is None:
        raise SMDDPError("smddp: no smddp client is attached in this process")
    return info


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    return _tdist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def broadcast(tensor, src=0, group=None, async_op=False):
    return _tdist.broadcast(tensor, src=src, group=group, async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return _tdist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
    return _tdist.all_to_all_single(
        output, input, output_split_sizes=output_split_sizes, input_split_sizes=input_split_sizes,
        group=group, async_op=async_op,
    )


def barrier(group=None, async_op=False):
    if group is None:
        group = _tdist.group.WORLD
    return _tdist.barrier(group=group, async_op=async_op)


__all__ = [
    "ReduceOp", "group", "is_available", "init_process_group", "is_initialized", "get_rank",
    "get_world_size", "get_local_rank", "get_local_size", "all_reduce", "broadcast", "all_gather",
    "all_to_all_single", "barrier",
]
