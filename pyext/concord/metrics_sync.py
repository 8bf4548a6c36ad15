"""Fused synchronisation of metric states across ranks.

A sync gathers the states of any number of metrics and issues one
collective per reduce op: every "sum" state in one ``all_reduce_multi``,
every "max" in one, every "min" in one, and every "cat" state packed as raw
bytes into one padded ``all_gather``. Before that, one small blocking
all-gather of a header makes ranks agree: it carries a fingerprint of the
states (names, reduce ops, shapes, dtypes) and the row counts of the cat
states, so ranks holding different metrics get ``MismatchError`` instead of
a hang or a silently wrong sum.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from . import collectives, world
from .errors import MismatchError

__all__ = ["Entry", "PendingSync", "StateSpec", "start_sync"]

REDUCE_OPS = ("sum", "max", "min")
OPS = (*REDUCE_OPS, "cat")


@dataclass(frozen=True)
class StateSpec:
    """One metric state: its reduce op, shape (for "cat": the shape of one
    row) and dtype."""

    op: str
    shape: tuple
    dtype: np.dtype

    def _bound(self):
        """The identity of max/min: the lowest / highest value of the dtype."""
        if self.dtype.kind == "f":
            return -np.inf if self.op == "max" else np.inf
        info = np.iinfo(self.dtype)
        return info.min if self.op == "max" else info.max

    def identity(self):
        """A new state holding no data: the identity of its reduce op."""
        if self.op == "cat":
            return np.empty((0, *self.shape), self.dtype)
        if self.op == "sum":
            return np.zeros(self.shape, self.dtype)
        return np.full(self.shape, self._bound(), self.dtype)

    def clear(self, state):
        """Empties a sum/max/min state in place (reusing its memory)."""
        state.fill(0 if self.op == "sum" else self._bound())

    def combine(self, a, b):
        """A new state holding the data of both `a` and `b`."""
        if self.op == "cat":
            return np.concatenate([a, b])
        return self.fold(a.copy(), b)

    def fold(self, state, data):
        """Adds `data` into `state`, in place for sum/max/min; returns the
        result (a new array for cat)."""
        if self.op == "sum":
            return np.add(state, data, out=state)
        if self.op == "max":
            return np.maximum(state, data, out=state)
        if self.op == "min":
            return np.minimum(state, data, out=state)
        return np.concatenate([state, data])

    def describe(self):
        return f"{self.op}{self.shape}{self.dtype.str}"

    def row_bytes(self):
        """Bytes of one row of a "cat" state."""
        return self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class Entry:
    """A state handed to a sync: `key` names it, `window` is this rank's
    data since the last sync (reduced in place for sum/max/min)."""

    key: tuple
    spec: StateSpec
    window: np.ndarray


def _fingerprint(entries):
    """64 bits identifying the states' keys, ops, shapes and dtypes, in order."""
    text = ";".join(f"{'/'.join(map(str, e.key))}={e.spec.describe()}" for e in entries)
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int(np.frombuffer(digest, np.int64)[0])


_MISMATCH = ("metric sync: ranks hold different metric states (names, reduce ops, shapes "
             "or dtypes differ)")


def _exchange_header(comm, entries, cats):
    """Blocking all-gather of [fingerprint, rows of each cat state]; returns
    the rows per (rank, cat state), or raises MismatchError on every rank."""
    header = np.array([_fingerprint(entries)] + [len(e.window) for e in cats], np.int64)
    try:
        gathered = collectives.all_gather(header, tiled=False, comm=comm)
    except MismatchError as exc:  # a different number of cat states
        raise MismatchError(f"{_MISMATCH}: {exc}") from exc
    differing = [r for r in range(comm.size) if gathered[r, 0] != gathered[0, 0]]
    if differing:
        raise MismatchError(f"{_MISMATCH}: ranks {differing} disagree with rank 0")
    return gathered[:, 1:]


def _pack_cats(cats, max_bytes):
    """This rank's cat windows as bytes, one after another, zero-padded to
    max_bytes so every rank sends the same count."""
    buffer = np.zeros(max_bytes, np.uint8)
    offset = 0
    for entry in cats:
        data = np.ascontiguousarray(entry.window).view(np.uint8).reshape(-1)
        buffer[offset:offset + data.size] = data
        offset += data.size
    return buffer


def _unpack_cats(cats, rows, gathered):
    """Each cat state's rows from every rank, concatenated in rank order."""
    row_bytes = [e.spec.row_bytes() for e in cats]
    parts = {e.key: [] for e in cats}
    for rank in range(gathered.shape[0]):
        offset = 0
        for i, entry in enumerate(cats):
            nbytes = int(rows[rank, i]) * row_bytes[i]
            chunk = gathered[rank, offset:offset + nbytes]
            parts[entry.key].append(chunk.view(entry.spec.dtype).reshape(-1, *entry.spec.shape))
            offset += nbytes
    return {key: np.concatenate(chunks) for key, chunks in parts.items()}


class PendingSync:
    """The collectives of one sync in flight. ``wait()`` may be called by
    every metric taking part: it waits once and returns the same results
    (or raises the same error) every time."""

    def __init__(self, entries, works, cat_finish):
        self._entries = entries
        self._works = works
        self._cat_finish = cat_finish
        self._results = None
        self._error = None

    def wait(self):
        """{key: this state's data over all ranks since their last sync}."""
        if self._error is not None:
            raise self._error
        if self._results is None:
            try:
                results = {}
                for work in self._works:
                    work.wait()
                for entry in self._entries:
                    if entry.spec.op != "cat":
                        results[entry.key] = entry.window
                if self._cat_finish is not None:
                    results.update(self._cat_finish())
            except BaseException as exc:
                self._error = exc
                raise
            self._results = results
        return self._results


def start_sync(entries, comm=None):
    """Starts the collectives syncing `entries` over `comm` (the world when
    None) and returns a PendingSync. Raises MismatchError, before anything
    asynchronous starts, when ranks disagree on the states."""
    comm = world.world() if comm is None else comm
    cats = [e for e in entries if e.spec.op == "cat"]
    rows = _exchange_header(comm, entries, cats)
    works = []
    for op in REDUCE_OPS:
        arrays = [e.window for e in entries if e.spec.op == op]
        if arrays:
            works.append(comm._handle.all_reduce_multi(arrays, op, True))
    return PendingSync(entries, works, _start_cat_gather(comm, cats, rows) if cats else None)


def _start_cat_gather(comm, cats, rows):
    """Starts the one padded all-gather of every cat window; returns the
    function that waits for it and unpacks the states."""
    row_bytes = np.array([e.spec.row_bytes() for e in cats], np.int64)
    max_bytes = int((rows * row_bytes).sum(axis=1).max())
    if not max_bytes:  # no rank has rows: nothing to send
        return lambda: {e.key: e.spec.identity() for e in cats}
    gather = collectives.all_gather(_pack_cats(cats, max_bytes), tiled=False, comm=comm,
                                    async_op=True)
    return lambda: _unpack_cats(cats, rows, gather.wait())
