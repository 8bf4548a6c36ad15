"""The world communicator of this process: where it is kept.

Only the state lives here, so that every module needing the world (the
collectives, meshes, metric syncs) can reach it without importing the
Communicator class and concord.init, which are built on the collectives.
"""

import os

from .errors import ConcordError

NOT_INITIALISED = "concord is not initialised: call concord.init() first"

_comm = None  # the Communicator concord.init() made, until concord.shutdown()


def get():
    """The world communicator as concord.init() made it, also when it was
    closed since (its collectives then say so); ConcordError when there is
    none."""
    if _comm is None:
        raise ConcordError(NOT_INITIALISED)
    return _comm


def is_open():
    return _comm is not None and not _comm.closed


def current():
    """The world communicator, open; ConcordError otherwise."""
    if not is_open():
        raise ConcordError(NOT_INITIALISED)
    return _comm


def replace(comm):
    """Makes `comm` (a Communicator, or None) the world; returns the previous one."""
    global _comm
    previous, _comm = _comm, comm
    return previous


def _forget_in_child():
    # A forked child starts without a world: the parent's communicator is
    # the parent's (its handle is never destroyed from the child).
    replace(None)


os.register_at_fork(after_in_child=_forget_in_child)
