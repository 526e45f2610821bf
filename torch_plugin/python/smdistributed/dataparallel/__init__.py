"""smdistributed.dataparallel: the smddp communication library for PyTorch.

Two lines turn a torch.distributed script into an smddp one::

    import smdistributed.dataparallel.torch.torch_smddp  # registers the "smddp" backend
    torch.distributed.init_process_group(backend="smddp")
"""

__version__ = "0.1.0"
