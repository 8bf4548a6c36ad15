"""The XLA FFI handler library of concord.jax (handlers.cpp, registry.cpp):
loaded once, its handlers registered with XLA for the CPU and CUDA, and the
communicators it runs on.

A traced computation names its communicator by an id (an attribute of each
call) that the library's registry maps to a communicator of its own: a
split of the caller's, made on the first use of that communicator from
JAX. XLA runs the handlers on its own threads, whenever the computation
runs; on their own communicator their collectives never share an issue
order with the caller's eager ones. When the caller's communicator closes,
its id is retired (after the calls running on it returned): a computation
traced with it then fails with a clear error instead of touching freed
memory.
"""

import ctypes
import threading
from pathlib import Path

import jax

from .. import _capi
from .._jax_build import INFO as BUILD
from ..errors import UnavailableError

__all__ = ["PLATFORMS", "comm_id", "problem", "target"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
# JAX's lowering platform -> XLA's registration platform.
PLATFORMS = {"cpu": "cpu", "cuda": "CUDA"}


def target(collective, platform):
    """The name of a handler, as its symbol and as XLA's custom-call target."""
    return f"concord_jax_{collective}_{platform}"


def _load():
    """The loaded library, or None and why not."""
    if not BUILD["built"]:
        return None, BUILD["problem"]
    path = Path(__file__).with_name("libconcord_jax.so")
    try:
        library = ctypes.CDLL(str(path))
    except OSError as exc:
        return None, f"{path} does not load: {exc}"
    library.concord_jax_attach.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
    library.concord_jax_attach.restype = ctypes.c_int
    library.concord_jax_detach.argtypes = [ctypes.c_int64]
    library.concord_jax_detach.restype = None
    for collective in COLLECTIVES:
        for platform, xla_platform in PLATFORMS.items():
            name = target(collective, platform)
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, name)),
                                        platform=xla_platform)
    return library, None


_library, _problem = _load()


def problem():
    """Why the handlers cannot run (None when they can)."""
    return _problem


# ---- communicators ------------------------------------------------------------------

_ids = {}  # address of a caller's communicator handle -> id of the library's split of it
_ids_lock = threading.Lock()


def comm_id(comm):
    """The id the handlers know `comm` (a Communicator) by; the first call
    for a communicator splits it, which is collective over its ranks (every
    rank traces the same program, so they all get here together)."""
    if _problem is not None:
        raise UnavailableError(f"concord.jax cannot run inside jax transformations: {_problem}")
    address = comm._handle.address  # ConcordError when it is closed
    with _ids_lock:
        found = _ids.get(address)
        if found is None:
            new = ctypes.c_int64()
            _capi.check_status(_library.concord_jax_attach(address, ctypes.byref(new)))
            found = _ids[address] = new.value
    return found


def _retire(address):
    """A communicator handle is about to be destroyed: its split goes first."""
    with _ids_lock:
        found = _ids.pop(address, None)
    if found is not None:
        _library.concord_jax_detach(found)


_capi.add_close_listener(_retire)
