"""The constants of the C headers, as Python values: the status codes, the
C codes of the reduce ops and gradient compressions by their Python names,
and the DLPack device types of host and CUDA memory.

Every value comes from the declarations in _capi.pxd, so the headers are
their only source. Nothing of concord is imported here, so that any module
may use this one.
"""

import enum

from ._capi cimport (
    CONCORD_COMPRESS_BF16,
    CONCORD_COMPRESS_FP16,
    CONCORD_COMPRESS_NONE,
    CONCORD_ERR_ABORTED,
    CONCORD_ERR_INTERNAL,
    CONCORD_ERR_INTERRUPTED,
    CONCORD_ERR_INVALID_ARGUMENT,
    CONCORD_ERR_MISMATCH,
    CONCORD_ERR_OUT_OF_MEMORY,
    CONCORD_ERR_REMOTE,
    CONCORD_ERR_TIMEOUT,
    CONCORD_ERR_UNAVAILABLE,
    CONCORD_MAX,
    CONCORD_MEAN,
    CONCORD_MIN,
    CONCORD_OK,
    CONCORD_PROD,
    CONCORD_SUM,
    kDLCPU,
    kDLCUDA,
    kDLCUDAHost,
    kDLCUDAManaged,
)

__all__ = ["COMPRESSIONS", "CUDA_DEVICE_TYPES", "HOST_DEVICE_TYPES", "REDUCE_OPS", "Status"]


class Status(enum.IntEnum):
    """Status codes of the C ABI."""
    OK = CONCORD_OK
    INVALID_ARGUMENT = CONCORD_ERR_INVALID_ARGUMENT
    UNAVAILABLE = CONCORD_ERR_UNAVAILABLE
    TIMEOUT = CONCORD_ERR_TIMEOUT
    REMOTE = CONCORD_ERR_REMOTE
    MISMATCH = CONCORD_ERR_MISMATCH
    ABORTED = CONCORD_ERR_ABORTED
    OUT_OF_MEMORY = CONCORD_ERR_OUT_OF_MEMORY
    INTERNAL = CONCORD_ERR_INTERNAL
    INTERRUPTED = CONCORD_ERR_INTERRUPTED


# The `op` of the collectives: name -> concord_reduce_op.
REDUCE_OPS = {
    "sum": CONCORD_SUM,
    "mean": CONCORD_MEAN,
    "max": CONCORD_MAX,
    "min": CONCORD_MIN,
    "prod": CONCORD_PROD,
}

# The `compress` of gradient synchronisation: name (None: none) -> concord_compress.
COMPRESSIONS = {
    None: CONCORD_COMPRESS_NONE,
    "bf16": CONCORD_COMPRESS_BF16,
    "fp16": CONCORD_COMPRESS_FP16,
}

# DLPack device types of memory the host reads directly (pinned host memory
# included), and of CUDA device memory (managed memory included).
HOST_DEVICE_TYPES = frozenset({kDLCPU, kDLCUDAHost})
CUDA_DEVICE_TYPES = frozenset({kDLCUDA, kDLCUDAManaged})
