"""The CUDA stream concord enqueues work on for a caller's array.

concord follows the caller's framework: work on a torch tensor goes on
torch's current stream for its device, work on a CuPy array on CuPy's
current stream, so it is ordered with the caller's own kernels as theirs
are with each other. Other producers (JAX, ...) get the legacy default
stream, which the DLPack handshake (``__dlpack__(stream=1)``) makes their
data ready on. The value is a ``cudaStream_t`` as an integer; 0 is the
legacy default stream.
"""

import sys


def consumer_stream(array, device_id):
    """The stream to enqueue work on `array` (on CUDA device `device_id`)."""
    module = type(array).__module__
    if module.startswith("torch"):
        torch = sys.modules.get("torch")
        if torch is not None:
            return torch.cuda.current_stream(device_id).cuda_stream
    elif module.startswith("cupy"):
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            return cupy.cuda.get_current_stream().ptr
    return 0
