"""concord's exceptions as torch.distributed reports a backend's failures."""

import contextlib

import torch.distributed as dist

from ..errors import ConcordError


def backend_error(error):
    """A DistBackendError with `error`'s message, caused by it (so that
    concord's class and status stay reachable through __cause__)."""
    translated = dist.DistBackendError(f"concord: {error}")
    translated.__cause__ = error
    return translated


@contextlib.contextmanager
def translated():
    """Re-raises concord's exceptions raised in the block as DistBackendError."""
    try:
        yield
    except ConcordError as error:
        raise backend_error(error) from error
