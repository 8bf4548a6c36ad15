"""Exceptions raised by concord.

Each class stands for one status of the C ABI (``concord.Status``, whose
values come from the C header); ``ConcordError.status`` says which. Errors
raised by the Python layer itself for misuse of its state (no world
communicator yet, a closed communicator) are plain ``ConcordError`` with
``status`` None. All of them pickle, so they cross process boundaries.
"""

from ._constants import Status

__all__ = [
    "AbortedError",
    "CollectiveTimeoutError",
    "ConcordError",
    "InvalidArgumentError",
    "MismatchError",
    "RemoteError",
    "Status",
    "UnavailableError",
]


class ConcordError(RuntimeError):
    """Base class of concord's errors; ``status`` is the C status, if any."""

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status

    def __reduce__(self):
        return type(self), (str(self), self.status)


class InvalidArgumentError(ConcordError, ValueError):
    """Bad input, caught before any communication."""

    status = Status.INVALID_ARGUMENT


class CollectiveTimeoutError(ConcordError, TimeoutError):
    """A blocking operation ran past its timeout."""

    status = Status.TIMEOUT


class RemoteError(ConcordError):
    """A peer failed, died or aborted."""

    status = Status.REMOTE


class MismatchError(ConcordError):
    """Ranks disagree on a collective (operation, dtype, shape or op)."""

    status = Status.MISMATCH


class UnavailableError(ConcordError):
    """A backend or device is not available in this build or on this machine."""

    status = Status.UNAVAILABLE


class AbortedError(ConcordError):
    """This communicator was aborted."""

    status = Status.ABORTED
