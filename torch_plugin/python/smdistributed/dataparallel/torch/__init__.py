"""PyTorch integration of smddp.

* ``smdistributed.dataparallel.torch.torch_smddp``: importing it registers the c10d backend
  ``"smddp"``.
* ``smdistributed.dataparallel.torch.distributed``: the old (v1) smdistributed API.
* ``smdistributed.dataparallel.torch.parallel.DistributedDataParallel``: the v1 DDP wrapper.
"""
