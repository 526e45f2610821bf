"""``smdistributed.dataparallel.torch.parallel.DistributedDataParallel``: the v1 DDP wrapper,
now a thin layer over torch's DDP on an smddp process group."""

import torch
import torch.distributed as _tdist

from smdistributed.dataparallel.exceptions import SMDDPError
from smdistributed.dataparallel.torch import torch_smddp as _torch_smddp  # noqa: F401 (registers "smddp")


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, module, device_ids=None, output_device=None, broadcast_buffers=True,
                 process_group=None, bucket_cap_mb=25, **kwargs):
        if not _tdist.is_initialized():
            raise SMDDPError(
                "smddp: DistributedDataParallel needs an initialized process group; call "
                "smdistributed.dataparallel.torch.distributed.init_process_group() first"
            )
        super().__init__(
            module,
            device_ids=device_ids,
            output_device=output_device,
            broadcast_buffers=broadcast_buffers,
            process_group=process_group,
            bucket_cap_mb=bucket_cap_mb,
            **kwargs,
        )
