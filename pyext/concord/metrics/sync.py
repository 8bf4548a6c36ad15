"""Fused synchronisation of metric states across ranks.

A sync gathers the states of any number of metrics and issues one
collective per reduce op: every "sum" state in one ``all_reduce_multi``,
every "max" in one, every "min" in one, and every "cat" state packed as raw
bytes into one padded ``all_gather``. Before that, one small blocking
all-gather of a header makes ranks agree: it carries a fingerprint of the
states (names, reduce ops, shapes, dtypes) and the row counts of the cat
states, so ranks holding different metrics get ``MismatchError`` instead of
a hang or a silently wrong sum. The windows themselves are never written:
the sum/max/min ones are reduced in copies, so a failed sync loses nothing.

States may be arrays of any library with in-place updates (NumPy, torch,
CuPy) on the host or a GPU. The collectives take them through DLPack, so
each rank's states are reduced where they live: the states of one device
(all host ones, NumPy and torch alike; the ones of a GPU) go in one
collective per reduce op, CUDA ones through NCCL, on the array library's
current stream. The fingerprint includes whether each state is on the host
or a GPU, so ranks holding one state in different places get
MismatchError rather than collectives that never meet. Everything done to
the states here runs in their own library on their own device, and no
device data is read on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from array_api_compat import device as array_device

from .. import _world, collectives
from .._host import device_key
from ..communicator import Communicator
from ..errors import InvalidArgumentError
from .._pytree import agree, group_indices
from ..arrays import namespace

__all__ = ["Entry", "PendingSync", "StateSpec", "array_home", "start_sync"]

REDUCE_OPS = ("sum", "max", "min")


def array_home(array):
    """(namespace, device) of an array: (numpy, None) for NumPy arrays."""
    if isinstance(array, np.ndarray):
        return np, None
    return namespace(array), array_device(array)


@dataclass(frozen=True)
class StateSpec:
    """One metric state: its reduce op, shape (for "cat": the shape of one
    row) and dtype (a NumPy dtype; states of another library have the
    dtype of the same name there).

    Each method works on the states' own namespace: ``identity`` allocates
    in the namespace and on the device it is given (NumPy by default); the
    others follow their arguments."""

    op: str
    shape: tuple
    dtype: np.dtype

    def _bound(self):
        """The identity of max/min: the lowest / highest value of the dtype."""
        if self.dtype.kind == "f":
            return -np.inf if self.op == "max" else np.inf
        info = np.iinfo(self.dtype)
        return info.min if self.op == "max" else info.max

    def dtype_in(self, xp):
        """This state's dtype in the namespace `xp`."""
        return self.dtype if xp is np else getattr(xp, self.dtype.name)

    def identity(self, xp=np, device=None):
        """A new state holding no data (the identity of its reduce op), in
        namespace `xp` on `device`."""
        if xp is np:
            if self.op == "cat":
                return np.empty((0, *self.shape), self.dtype)
            if self.op == "sum":
                return np.zeros(self.shape, self.dtype)
            return np.full(self.shape, self._bound(), self.dtype)
        dtype = self.dtype_in(xp)
        if self.op == "cat":
            return xp.empty((0, *self.shape), dtype=dtype, device=device)
        if self.op == "sum":
            return xp.zeros(self.shape, dtype=dtype, device=device)
        return xp.full(self.shape, self._bound(), dtype=dtype, device=device)

    def clear(self, state):
        """Empties a sum/max/min state in place (reusing its memory)."""
        value = 0 if self.op == "sum" else self._bound()
        if isinstance(state, np.ndarray):
            state.fill(value)
        else:
            state[...] = value

    def combine(self, a, b):
        """A new state holding the data of both `a` and `b`."""
        if isinstance(a, np.ndarray):
            if self.op == "cat":
                return np.concatenate([a, b])
            return self.fold(a.copy(), b)
        xp = namespace(a)
        if self.op == "cat":
            return xp.concat([a, b])
        if self.op == "sum":
            return a + b
        return (xp.maximum if self.op == "max" else xp.minimum)(a, b)

    def fold(self, state, data):
        """Adds `data` into `state` (in place for NumPy and for sums);
        returns the result (a new array for cat)."""
        if isinstance(state, np.ndarray):
            if self.op == "sum":
                return np.add(state, data, out=state)
            if self.op == "max":
                return np.maximum(state, data, out=state)
            if self.op == "min":
                return np.minimum(state, data, out=state)
            return np.concatenate([state, data])
        if self.op == "sum":
            state += data
            return state
        return self.combine(state, data)

    def describe(self):
        return f"{self.op}{self.shape}{self.dtype.str}"

    def row_bytes(self):
        """Bytes of one row of a "cat" state."""
        return self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class Entry:
    """A state handed to a sync: `key` names it, `window` is this rank's
    data since the last sync, which the sync never writes: a sum/max/min
    state is reduced in a copy, made in `buffer` (an array like the window,
    kept from an earlier sync) when one is given, so a sync that fails
    leaves the window as it was."""

    key: tuple
    spec: StateSpec
    window: object  # an array of the metric's namespace, on its device
    buffer: object = None


def _signature(entries, devices=None):
    """What ranks must agree on: the states' keys, ops, shapes, dtypes and
    device kinds (host or GPU), in order; devices[id(entry)] is its
    device_key, found here when not given."""
    if devices is None:
        devices = {id(e): device_key(e.window) for e in entries}
    return ";".join(f"{'/'.join(map(str, e.key))}={e.spec.describe()}@{devices[id(e)][0]}"
                    for e in entries)


_MISMATCH = ("metric sync: ranks hold different metric states (names, reduce ops, shapes, "
             "dtypes, or host versus GPU, differ)")


def _by_device(entries, devices):
    """The entries grouped by the device their window lives on (all host
    arrays together), groups in order of first appearance: the same on every
    rank, whose signatures pin each state to the host or a GPU."""
    groups = group_indices(devices[id(entry)] for entry in entries)
    return [[entries[i] for i in indices] for indices in groups.values()]


def _in(xp, array):
    """`array` as an array of namespace `xp` on its own device (through
    DLPack, without a copy, when it is of another library)."""
    return array if namespace(array) is xp else xp.from_dlpack(array)


def _as_bytes(array, xp):
    """The bytes of `array` (of namespace xp) as a 1-D uint8 array."""
    if xp is np:
        return np.ascontiguousarray(array).view(np.uint8).reshape(-1)
    try:  # torch and CuPy reinterpret memory with .view(dtype); the array API cannot
        return xp.reshape(array, (-1,)).view(xp.uint8)
    except (AttributeError, TypeError, RuntimeError) as exc:
        raise ValueError(f"metric sync: cannot gather Cat states held in "
                         f"{type(array).__module__}.{type(array).__qualname__} arrays: their "
                         f"bytes cannot be reinterpreted ({exc})") from exc


def _pack_cats(cats, max_bytes):
    """This rank's cat windows (all on one device) as bytes, one after
    another, zero-padded to max_bytes so every rank sends the same count;
    in the namespace of the first window."""
    xp, device = array_home(cats[0].window)
    if xp is np:
        buffer = np.zeros(max_bytes, np.uint8)
        offset = 0
        for entry in cats:
            data = _as_bytes(_in(np, entry.window), np)
            buffer[offset:offset + data.size] = data
            offset += data.size
        return buffer
    parts = [_as_bytes(_in(xp, entry.window), xp) for entry in cats]
    used = sum(int(part.shape[0]) for part in parts)
    parts.append(xp.zeros((max_bytes - used,), dtype=xp.uint8, device=device))
    return xp.concat(parts)


def _unpack_cats(cats, rows, gathered):
    """Each cat state's rows from every rank, concatenated in rank order, in
    the namespace of the state's own window."""
    xp = namespace(gathered)
    row_bytes = [e.spec.row_bytes() for e in cats]
    chunks = [[] for _ in cats]
    for rank in range(gathered.shape[0]):
        offset = 0
        for i in range(len(cats)):
            nbytes = int(rows[rank, i]) * row_bytes[i]
            chunks[i].append(gathered[rank, offset:offset + nbytes])
            offset += nbytes
    results = {}
    for entry, parts in zip(cats, chunks):
        # Joined before the reinterpretation: a fresh array is aligned for any dtype.
        data = xp.concat(parts).view(entry.spec.dtype_in(xp))
        value = xp.reshape(data, (-1, *entry.spec.shape))
        results[entry.key] = _in(namespace(entry.window), value)
    return results


def _reduction_copy(entry):
    """A copy of a sum/max/min entry's window to reduce in place: in its
    buffer when it has one."""
    window, buffer = entry.window, entry.buffer
    if buffer is None:
        if isinstance(window, np.ndarray):
            return window.copy()
        return namespace(window).asarray(window, copy=True)
    if isinstance(buffer, np.ndarray):
        np.copyto(buffer, window)
    else:
        buffer[...] = window
    return buffer


class PendingSync:
    """The collectives of one sync in flight over `comm`. ``wait()`` may be
    called by every metric taking part: it waits once and returns the same
    results (or raises the same error) every time."""

    def __init__(self, comm, reduced, works, cat_finishes):
        self.comm = comm
        self._reduced = reduced  # {key: the reduced copy of a sum/max/min window}
        self._works = works
        self._cat_finishes = cat_finishes
        self._results = None
        self._error = None

    def check_comm(self, comm, what):
        """Raises InvalidArgumentError unless `comm` is None or the
        communicator this sync runs on (d9d passes its context to
        wait_sync as to trigger_sync)."""
        if comm is not None and comm is not self.comm:
            raise InvalidArgumentError(
                f"{what}: the sync was triggered on another communicator ({self.comm!r}, "
                f"here {comm!r}); pass the one given to trigger_sync(), or None")

    def wait(self):
        """{key: this state's data over all ranks since their last sync}."""
        if self._error is not None:
            raise self._error
        if self._results is None:
            try:
                for work in self._works:
                    work.wait()
                results = dict(self._reduced)
                for finish in self._cat_finishes:
                    results.update(finish())
            except BaseException as exc:
                self._error = exc
                raise
            self._results = results
        return self._results


def start_sync(entries, comm=None):
    """Starts the collectives syncing `entries` over `comm` (the world when
    None) and returns a PendingSync. Raises MismatchError, before anything
    asynchronous starts, when ranks disagree on the states, and
    InvalidArgumentError, before any communication, when `comm` is neither
    None nor a Communicator.

    One collective per reduce op and device: the states of every metric on
    the host in one, those on a GPU in another."""
    if comm is not None and not isinstance(comm, Communicator):
        raise InvalidArgumentError(f"metric sync: comm must be a concord Communicator or None "
                                   f"(the world), got a {type(comm).__name__}")
    comm = _world.current() if comm is None else comm
    cats = [e for e in entries if e.spec.op == "cat"]
    devices = {id(e): device_key(e.window) for e in entries}  # read once: slow for torch
    # Ranks agree on the states, and learn each other's cat row counts.
    rows = agree(comm, _signature(entries, devices), _MISMATCH,
                 extra=[len(e.window) for e in cats])
    reduced = {e.key: _reduction_copy(e) for e in entries if e.spec.op != "cat"}
    works = []
    for op in REDUCE_OPS:
        for group in _by_device([e for e in entries if e.spec.op == op], devices):
            works.append(comm._handle.all_reduce_multi([reduced[e.key] for e in group], op, True))
    finishes = []
    if cats:
        column = {id(e): i for i, e in enumerate(cats)}
        for group in _by_device(cats, devices):
            columns = [column[id(e)] for e in group]
            finishes.append(_start_cat_gather(comm, group, rows[:, columns]))
    return PendingSync(comm, reduced, works, finishes)


def _start_cat_gather(comm, cats, rows):
    """Starts the one padded all-gather of the cat windows of one device;
    returns the function that waits for it and unpacks the states."""
    row_bytes = np.array([e.spec.row_bytes() for e in cats], np.int64)
    max_bytes = int((rows * row_bytes).sum(axis=1).max())
    if not max_bytes:  # no rank has rows: nothing to send
        return lambda: {e.key: e.spec.identity(*array_home(e.window)) for e in cats}
    gather = collectives.all_gather(_pack_cats(cats, max_bytes), tiled=False, comm=comm,
                                    async_op=True)
    return lambda: _unpack_cats(cats, rows, gather.wait())
