"""The Metric lifecycle: local updates, asynchronous fused sync, compute.

Every state is linearly additive under its reduce op (sums and counts, maxima,
minima, concatenations; never ratios), and is kept as two parts:

- ``synced``: the data of every rank up to the last completed sync, the same
  on every rank;
- ``window``: what this rank added since then.

``trigger_sync()`` hands the window's arrays to the collectives and starts a
fresh, empty window; ``wait_sync()`` adds the reduced windows of all ranks to
``synced``. Each datum is thus sent exactly once: the synced part is never
sent again, and the window restarts empty, so ``update()`` after a sync
builds a new local window on top of the synced totals without double
counting. ``compute()`` reads ``synced`` combined with the current window
(on a rank that updated since the last sync, that includes its own
unsynced data). Metrics never sync on their own: call ``sync()`` (or
``trigger_sync()`` / ``wait_sync()``) before ``compute()`` for global values.

States live in NumPy arrays on the host; inputs are NumPy arrays, Python
sequences or any CPU DLPack array (torch, JAX), handed to the C update
kernels without a copy.
"""

from __future__ import annotations

import warnings

import numpy as np

from .metrics_sync import Entry, StateSpec, start_sync

__all__ = ["Metric", "to_numpy"]


def to_numpy(x):
    """`x` as a NumPy array, sharing memory with CPU DLPack arrays."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    return np.asarray(x)


def _fresh_window(spec):
    # A cat window collects the rows of each update; they are joined once,
    # when the window is read or sent.
    return [] if spec.op == "cat" else spec.identity()


class Metric:
    """Base class of the metrics: named states, each with a reduce op.

    Subclasses declare states with ``_add_state`` in ``__init__``, start
    ``update`` with ``self._begin_update()`` and add into
    ``self._window[name]``, and implement ``_compute`` from ``self._value(name)``.
    """

    def __init__(self):
        self._specs = {}
        self._synced = {}
        self._window = {}
        self._pending = None  # (PendingSync, entries) between trigger and wait
        # Window arrays back from a finished sync, cleared for the next
        # window: large states (a 1000-class confusion matrix) are not
        # reallocated, and their pages not faulted in again, on every sync.
        self._spare = {}

    # ---- for subclasses

    def _add_state(self, name, op, shape=(), dtype=np.float64):
        spec = StateSpec(op, tuple(shape), np.dtype(dtype))
        self._specs[name] = spec
        self._synced[name] = spec.identity()
        self._window[name] = _fresh_window(spec)

    def _begin_update(self):
        self._check_idle("update")

    def _window_value(self, name):
        window = self._window[name]
        if self._specs[name].op != "cat":
            return window
        return np.concatenate([self._specs[name].identity(), *window])

    def _value(self, name):
        """The state over the synced data and this rank's current window."""
        return self._specs[name].combine(self._synced[name], self._window_value(name))

    def _ratio(self, numerator, denominator):
        """numerator / denominator as a float; NaN with a RuntimeWarning when
        the denominator is zero (no samples yet, or none for this score)."""
        if denominator == 0:
            warnings.warn(f"{type(self).__name__}.compute(): zero division (no samples, or none "
                          "that this score counts); returning NaN", RuntimeWarning, stacklevel=3)
            return float("nan")
        return float(numerator / denominator)

    def _compute(self):
        raise NotImplementedError

    # ---- sync plumbing shared with MetricCollection

    def _check_idle(self, action):
        if self._pending is not None:
            raise RuntimeError(
                f"{type(self).__name__}.{action}() called while a sync is in flight: "
                "call wait_sync() first (the states are being reduced across ranks)")

    def _entries(self, prefix):
        return [Entry((*prefix, name), spec, self._window_value(name))
                for name, spec in self._specs.items()]

    def _hand_over(self, pending, entries):
        """The window's arrays now belong to the collectives; a new, empty
        window starts."""
        self._pending = (pending, entries)
        self._window = {name: self._next_window(name) for name in self._specs}

    def _next_window(self, name):
        spare = self._spare.pop(name, None)
        return _fresh_window(self._specs[name]) if spare is None else spare

    # ---- public lifecycle

    def trigger_sync(self, comm=None):
        """Starts syncing this rank's window with every rank of `comm` (the
        world when None): one asynchronous collective per reduce op. Every
        rank must call it, with the same metric. Returns immediately."""
        self._check_idle("trigger_sync")
        entries = self._entries(())
        self._hand_over(start_sync(entries, comm), entries)

    def wait_sync(self):
        """Waits for the sync started by trigger_sync() and folds the data of
        all ranks into the synced state. If the collective fails, the window
        is restored (nothing is lost) and the error raised."""
        if self._pending is None:
            raise RuntimeError(f"{type(self).__name__}.wait_sync() without trigger_sync()")
        pending, entries = self._pending
        self._pending = None
        try:
            results = pending.wait()
        except BaseException:
            # A failed collective leaves its arrays as they were.
            self._window = {e.key[-1]: [e.window] if e.spec.op == "cat" else e.window
                            for e in entries}
            raise
        for entry in entries:
            name = entry.key[-1]
            self._synced[name] = entry.spec.fold(self._synced[name], results[entry.key])
            if entry.spec.op != "cat":
                entry.spec.clear(entry.window)
                self._spare[name] = entry.window

    def sync(self, comm=None):
        """trigger_sync() then wait_sync()."""
        self.trigger_sync(comm)
        self.wait_sync()

    def compute(self):
        """The metric over the synced data and this rank's current window."""
        self._check_idle("compute")
        return self._compute()

    def reset(self):
        """Forgets all data, synced and local."""
        self._check_idle("reset")
        for name, spec in self._specs.items():
            self._synced[name] = spec.identity()
            self._window[name] = _fresh_window(spec)

    def state_dict(self):
        """{"metric": class name, "synced": {state: array}, "window": {state:
        array}}: copies of both parts, NumPy arrays only (np.savez-able)."""
        self._check_idle("state_dict")
        return {
            "metric": type(self).__name__,
            "synced": {name: array.copy() for name, array in self._synced.items()},
            "window": {name: np.array(self._window_value(name)) for name in self._specs},
        }

    def load_state_dict(self, state_dict):
        """Restores both parts from state_dict(); raises ValueError when the
        states do not match this metric's names, shapes or dtypes."""
        self._check_idle("load_state_dict")
        kind = state_dict.get("metric", type(self).__name__)
        if kind != type(self).__name__:
            raise ValueError(f"state_dict is of a {kind}, not a {type(self).__name__}")
        synced = {n: self._checked_state(n, a, "synced") for n, a in state_dict["synced"].items()}
        window = {n: self._checked_state(n, a, "window") for n, a in state_dict["window"].items()}
        for part, loaded in (("synced", synced), ("window", window)):
            if set(loaded) != set(self._specs):
                raise ValueError(f"state_dict[{part!r}] has states {sorted(loaded)}, "
                                 f"expected {sorted(self._specs)}")
        self._synced = synced
        self._window = {n: [a] if self._specs[n].op == "cat" else a for n, a in window.items()}

    def _checked_state(self, name, array, part):
        spec = self._specs.get(name)
        if spec is None:
            raise ValueError(f"state_dict[{part!r}] has an unknown state {name!r}; "
                             f"expected {sorted(self._specs)}")
        array = np.array(to_numpy(array), copy=True)
        expected = spec.shape
        if spec.op == "cat":  # any number of rows
            expected = (array.shape[0] if array.ndim else "rows", *spec.shape)
        if array.shape != expected or array.dtype != spec.dtype:
            raise ValueError(f"state_dict[{part!r}][{name!r}] has shape {array.shape} and dtype "
                             f"{array.dtype}, expected {expected} and {spec.dtype}")
        return array
