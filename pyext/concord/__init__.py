"""concord: framework-agnostic collectives for data-parallel training."""

import json

from . import _capi, _jax_build
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
from . import data_parallel, metrics, optim, training
from .training import GradientSynchronizer, train_step
from .notebook import launch
from .mesh import (
    DeviceMeshManager,
    Mesh,
    NamedSharding,
    PartitionSpec,
    current_mesh,
    make_mesh,
    use_mesh,
)
from .communicator import (
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
    """What this build supports: version, backends, CUDA, NCCL, and
    concord.jax's XLA FFI handlers ("jax": built, the jaxlib they were built
    against, and why not when they were not)."""
    info = json.loads(_capi.build_info())
    info["jax"] = dict(_jax_build.INFO)
    return info


__all__ = [
    "AbortedError",
    "CollectiveTimeoutError",
    "Communicator",
    "ConcordError",
    "DeviceMeshManager",
    "GradientSynchronizer",
    "InvalidArgumentError",
    "Mesh",
    "MismatchError",
    "NamedSharding",
    "PartitionSpec",
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
    "current_mesh",
    "data_parallel",
    "init",
    "is_initialized",
    "launch",
    "local_rank",
    "make_mesh",
    "metrics",
    "optim",
    "rank",
    "reduce_scatter",
    "shutdown",
    "train_step",
    "training",
    "use_mesh",
    "world",
    "world_size",
]
