"""concord: framework-agnostic collectives for data-parallel training."""

import json

from . import _capi
from ._capi import Work
from .collectives import all_gather, all_reduce, barrier, broadcast, reduce_scatter
from .errors import (
    AbortedError,
    CollectiveTimeoutError,
    ConcordError,
    InvalidArgumentError,
    MismatchError,
    RemoteError,
    Status,
    UnavailableError,
)
from .launch import launch
from .world import (
    Communicator,
    init,
    is_initialized,
    local_rank,
    rank,
    shutdown,
    world,
    world_size,
)

__version__ = _capi.version()


def build_info():
    """What this build supports: version, backends, CUDA, NCCL."""
    return json.loads(_capi.build_info())


__all__ = [
    "AbortedError",
    "CollectiveTimeoutError",
    "Communicator",
    "ConcordError",
    "InvalidArgumentError",
    "MismatchError",
    "RemoteError",
    "Status",
    "UnavailableError",
    "Work",
    "__version__",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "build_info",
    "init",
    "is_initialized",
    "launch",
    "local_rank",
    "rank",
    "reduce_scatter",
    "shutdown",
    "world",
    "world_size",
]
