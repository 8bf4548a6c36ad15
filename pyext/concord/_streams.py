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

from ._constants import CUDA_DEVICE_TYPES


_torch_raw_stream = None  # torch's current raw stream of a device, once torch is seen


def _torch_stream_getter(torch):
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device_id: torch.cuda.current_stream(device_id).cuda_stream


def prepare_export(array):
    """(the array to export, the stream to enqueue its work on, the `stream`
    argument of its ``__dlpack__``); both streams are None for an array in
    host memory (exported with no stream argument).

    torch's data is ready on its current stream, the one work is enqueued
    on: its ``__dlpack__`` gets -1, no synchronisation (naming the stream
    would make torch wrap it and record an event on every call). Others get
    the stream itself, with 1 for the legacy default stream (DLPack does
    not allow 0). torch tensors that require grad are exported detached
    (the same memory: DLPack refuses them otherwise)."""
    global _torch_raw_stream
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        if array.requires_grad:
            array = array.detach()
        if not array.is_cuda:
            return array, None, None
        if _torch_raw_stream is None:
            _torch_raw_stream = _torch_stream_getter(torch)
        return array, _torch_raw_stream(array.get_device()), -1
    device = getattr(array, "__dlpack_device__", None)
    if device is None:
        return array, None, None
    device_type, device_id = device()
    if device_type not in CUDA_DEVICE_TYPES:
        return array, None, None
    stream = 0
    if type(array).__module__.startswith("cupy"):
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            stream = cupy.cuda.get_current_stream().ptr
    return array, stream, stream if stream != 0 else 1
