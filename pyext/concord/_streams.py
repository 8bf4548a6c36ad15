"""The CUDA stream concord enqueues work on for a caller's array.

concord follows the caller's framework: work on a torch tensor goes on
torch's current stream for its device, work on a CuPy array on CuPy's
current stream, so it is ordered with the caller's own kernels as theirs
are with each other. Other producers (JAX, ...) get the legacy default
stream, which the DLPack handshake (``__dlpack__(stream=1)``) makes their
data ready on. A stream is a ``cudaStream_t`` as an integer; 0 is the
legacy default stream.

This runs on every call with a non-NumPy array, so torch tensors, the
common case, take a path that asks torch directly instead of going through
``__dlpack_device__``.
"""

import sys

_KDL_CUDA = 2
_KDL_CUDA_MANAGED = 13

_torch_raw_stream = None  # torch's current raw stream of a device, once torch is seen


def _torch_stream_getter(torch):
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device_id: torch.cuda.current_stream(device_id).cuda_stream


def dlpack_stream(array):
    """None for an array in host memory (exported with no stream); for a
    CUDA array, the stream to enqueue work on and to name in its
    ``__dlpack__(stream=...)``."""
    global _torch_raw_stream
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        if not array.is_cuda:
            return None
        if _torch_raw_stream is None:
            _torch_raw_stream = _torch_stream_getter(torch)
        return _torch_raw_stream(array.get_device())
    device = getattr(array, "__dlpack_device__", None)
    if device is None:
        return None
    device_type, device_id = device()
    if device_type != _KDL_CUDA and device_type != _KDL_CUDA_MANAGED:
        return None
    if type(array).__module__.startswith("cupy"):
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            return cupy.cuda.get_current_stream().ptr
    return 0
