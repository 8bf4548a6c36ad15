"""Communicators: the Communicator class, and joining and leaving the world
(concord.init, concord.shutdown) with the queries of the world's ranks."""

import os
import sys
import weakref

from . import _capi, _torchrun, _world, collectives
from .errors import ConcordError, InvalidArgumentError

__all__ = [
    "Communicator",
    "init",
    "is_initialized",
    "local_rank",
    "rank",
    "shutdown",
    "world",
    "world_size",
]


class Communicator:
    """A group of ranks that run collectives together.

    As a context manager it closes on exit, aborting first when the block
    raised, so that peers waiting in a collective fail fast (see close()).
    """

    __slots__ = ("_handle", "__weakref__")

    def __init__(self, handle):
        self._handle = handle
        _live.add(self)

    @property
    def rank(self):
        return self._handle.rank

    @property
    def size(self):
        return self._handle.size

    @property
    def local_rank(self):
        """Rank among the ranks on this host."""
        return self._handle.local_rank

    @property
    def backend(self):
        """Name of the backend used for CPU arrays."""
        return self._handle.backend

    @property
    def timeout(self):
        """Seconds any blocking operation may take before it fails."""
        return self._handle.timeout

    @property
    def closed(self):
        return self._handle.closed

    def split(self, color, key=0):
        """Collective over this communicator: ranks passing the same color
        form a new communicator, ordered by (key, rank). A color of None (or
        negative) joins none and gets None."""
        handle = self._handle.split(-1 if color is None else color, key)
        return None if handle is None else Communicator(handle)

    def abort(self):
        """Fails pending and future collectives here and on the peers."""
        self._handle.abort()

    def close(self):
        """Closes the communicator once its queued collectives finished.
        Called while an exception is raised or handled (in a ``finally``
        or ``except`` block), it aborts first: a failing rank does not wait
        for work its peers may never join, and they fail at once."""
        if sys.exc_info()[1] is not None and not self.closed:
            self.abort()
        self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()

    def __repr__(self):
        if self.closed:
            return "Communicator(closed)"
        return f"Communicator(rank={self.rank}, size={self.size}, backend={self.backend!r})"

    def all_reduce(self, x, op="sum", *, out=None, async_op=False):
        return collectives.all_reduce(x, op, comm=self, out=out, async_op=async_op)

    def all_gather(self, x, *, axis=0, tiled=True, out=None, async_op=False):
        return collectives.all_gather(x, axis=axis, tiled=tiled, comm=self, out=out,
                                      async_op=async_op)

    def reduce_scatter(self, x, op="sum", *, axis=0, out=None, async_op=False):
        return collectives.reduce_scatter(x, op, axis=axis, comm=self, out=out,
                                          async_op=async_op)

    def broadcast(self, x, root=0, *, out=None, async_op=False):
        return collectives.broadcast(x, root, comm=self, out=out, async_op=async_op)

    def barrier(self):
        collectives.barrier(comm=self)


# The communicators of this process still referenced. A process dying of an
# uncaught exception aborts them first, so its peers fail at once naming it,
# instead of waiting for the work it queued until their timeouts.
_live = weakref.WeakSet()


def abort_open_communicators():
    """Aborts every open communicator of this process (for a process that
    is failing: its peers' collectives fail at once)."""
    for comm in list(_live):
        if not comm.closed:
            try:
                comm.abort()
            except ConcordError:
                pass  # already unusable: the peers learn of it anyway


def _aborting_first(excepthook):
    def abort_then_report(exc_type, exc, tb):
        abort_open_communicators()
        excepthook(exc_type, exc, tb)
    return abort_then_report


sys.excepthook = _aborting_first(sys.excepthook)
# A forked child's communicators are its parent's, which it must not abort.
os.register_at_fork(after_in_child=_live.clear)


def _optional(value, unset):
    return unset if value is None else value


def _explicit_count(value, name):
    """`value` (None: from the environment) for C, where -1 means unset and
    so a caller's negative number must be refused here."""
    if value is None:
        return -1
    if value < 0:
        raise InvalidArgumentError(f"{name} must be >= 0, got {value}")
    return value


def init(backend="auto", *, rank=None, world_size=None, master_addr=None, master_port=None,
         timeout=None):
    """Joins the world communicator and returns it.

    Arguments left None come from the environment: CONCORD_*, then torchrun
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open MPI, PMI,
    SLURM; with nothing set this process is a world of one. `timeout` (seconds,
    default CONCORD_TIMEOUT or 600; inf: no limit) bounds every blocking
    operation. Under torchrun across several hosts, rank 0 serves concord's
    store and publishes it in torch's (concord._torchrun).
    """
    if is_initialized():
        raise ConcordError("concord is already initialised: call concord.shutdown() first")
    if timeout is not None and not timeout > 0:
        raise InvalidArgumentError(f"timeout must be positive, got {timeout}")
    rank_c = _explicit_count(rank, "rank")
    world_size_c = _explicit_count(world_size, "world_size")
    store = None
    if master_addr is None and master_port is None:
        store = _torchrun.published_store(rank, world_size, timeout)
    if store is not None:
        master_addr, master_port = store.host, store.port
    handle = _capi.Comm.init(
        rank=rank_c,
        world_size=world_size_c,
        master_addr=master_addr,
        master_port=_optional(master_port, 0),
        token=None if store is None else store.token,
        timeout=_optional(timeout, 0.0),
        backend=backend,
        store_server=None if store is None else store.server,
    )
    comm = Communicator(handle)
    _world.replace(comm)
    return comm


def shutdown():
    """Closes the world communicator (aborting it first when called while an
    exception is raised or handled, see Communicator.close); init() may be
    called again afterwards."""
    comm = _world.replace(None)
    if comm is not None:
        comm.close()


def is_initialized():
    return _world.is_open()


def world():
    """The world communicator."""
    return _world.current()


def rank():
    return world().rank


def world_size():
    return world().size


def local_rank():
    return world().local_rank

