"""Errors raised by smddp.

Every error is an :class:`SMDDPError` (itself a ``RuntimeError``, so code that catches what
other torch.distributed backends raise keeps working). The subclass says what kind of failure
it was; the message says what failed and why.
"""


class SMDDPError(RuntimeError):
    """Base class of every smddp error."""


class SMDDPInvalidArgumentError(SMDDPError, ValueError):
    """A call got arguments smddp cannot use (shapes, ranks, non-contiguous tensors...).

    Raised before anything is sent: the process group stays usable.
    """


class SMDDPUnsupportedError(SMDDPError, NotImplementedError):
    """A dtype, reduce op or device that smddp does not handle."""


class SMDDPMismatchError(SMDDPError):
    """The ranks called different collectives (op, dtype, count, reduce op or root differ)."""


class SMDDPPeerFailedError(SMDDPError):
    """A rank or daemon of the job died."""


class SMDDPTimeoutError(SMDDPError):
    """Not every rank posted the collective within the process group's timeout."""


class SMDDPDaemonUnreachableError(SMDDPError):
    """No smddp daemon could be reached for this rank (see the message for how to start one)."""


class SMDDPShutdownError(SMDDPError):
    """The smddp daemon is shutting down."""


class SMDDPInternalError(SMDDPError):
    """A bug in smddp; please report it with the message."""


__all__ = [
    "SMDDPError",
    "SMDDPInvalidArgumentError",
    "SMDDPUnsupportedError",
    "SMDDPMismatchError",
    "SMDDPPeerFailedError",
    "SMDDPTimeoutError",
    "SMDDPDaemonUnreachableError",
    "SMDDPShutdownError",
    "SMDDPInternalError",
]
