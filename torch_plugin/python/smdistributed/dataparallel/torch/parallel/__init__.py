from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel  # noqa: F401
