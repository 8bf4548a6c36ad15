"""Where an array lives, and host NumPy copies of arrays of any library.

Only metadata is read here (DLPack device codes, shapes, dtypes), except by
``to_host``, which copies the data to the host and so waits for it.
"""

from __future__ import annotations

import numpy as np
from array_api_compat import is_cupy_array, is_jax_array, is_torch_array

from ._constants import CUDA_DEVICE_TYPES, HOST_DEVICE_TYPES

__all__ = ["device_key", "is_host", "on_cuda", "to_host"]


def device_key(x):
    """(kind, id) of the memory `x` lives in: ("cpu", 0) for NumPy arrays,
    Python values and host DLPack arrays, ("cuda", n) for CUDA device n, and
    ("dlpack<type>", n) for other DLPack devices. Reads metadata only."""
    probe = None if isinstance(x, np.ndarray) else getattr(x, "__dlpack_device__", None)
    if probe is None:
        return ("cpu", 0)
    kind, index = probe()
    kind = int(kind)
    if kind in HOST_DEVICE_TYPES:
        return ("cpu", 0)
    if kind in CUDA_DEVICE_TYPES:
        return ("cuda", int(index))
    return (f"dlpack{kind}", int(index))


def on_cuda(x):
    """Whether `x` lives in CUDA device (or managed) memory."""
    return device_key(x)[0] == "cuda"


def is_host(x):
    """Whether `x` lives in host memory (NumPy arrays and Python values do)."""
    return device_key(x)[0] == "cpu"


def to_host(x):
    """A NumPy copy of `x` on the host, never sharing memory with `x`.

    NumPy arrays are copied; host DLPack arrays are read through
    ``np.from_dlpack`` and copied; torch tensors elsewhere come back with
    ``.detach().cpu()``, CuPy arrays with ``.get()``, JAX arrays with
    ``np.asarray``; any other array through the array API's
    ``to_device(x, "cpu")``. Reading device data waits for it (a host
    synchronisation): for compute() and state_dict(), never for updates."""
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, np.generic) or not hasattr(x, "__dlpack__"):
        return np.array(x, copy=True)
    if is_host(x):
        try:
            return np.array(np.from_dlpack(x), copy=True)
        except (BufferError, TypeError, RuntimeError, ValueError):
            pass  # e.g. a torch tensor requiring grad: the library's own way below
    if is_torch_array(x):
        return np.array(x.detach().cpu().numpy(), copy=True)
    if is_cupy_array(x):
        return x.get()
    if is_jax_array(x):
        return np.array(np.asarray(x), copy=True)
    to_device = getattr(x, "to_device", None)
    if to_device is not None:
        return np.array(np.from_dlpack(to_device("cpu")), copy=True)
    return np.array(x, copy=True)
