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

from ._host import _CUDA_TYPES


_torch_raw_stream = None  # torch's current raw stream of a device, once torch is seen


def _torch_stream_getter(torch):
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device_id: torch.cuda.current_stream(device_id).cuda_stream


def prepare_export(array):
    """(the array to export, its stream): the stream is None for an array in
    host memory (exported with no stream argument), else the CUDA stream to
    enqueue work on. torch tensors that require grad are exported detached
    (the same memory: DLPack refuses them otherwise)."""
    global _torch_raw_stream
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        if array.requires_grad:
            array = array.detach()
        if not array.is_cuda:
            return array, None
        if _torch_raw_stream is None:
            _torch_raw_stream = _torch_stream_getter(torch)
        return array, _torch_raw_stream(array.get_device())
    device = getattr(array, "__dlpack_device__", None)
    if device is None:
        return array, None
    device_type, device_id = device()
    if device_type not in _CUDA_TYPES:
        return array, None
    if type(array).__module__.startswith("cupy"):
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            return array, cupy.cuda.get_current_stream().ptr
    return array, 0


def handshake_stream(array, stream):
    """The `stream` argument of ``array.__dlpack__`` for work on `stream`.

    torch's data is ready on its current stream, which is `stream` itself:
    -1 asks for no synchronisation (naming the stream would make torch wrap
    it and record an event on every call). Others get the stream, with 1
    for the legacy default stream (DLPack does not allow 0)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        return -1
    return stream if stream != 0 else 1
