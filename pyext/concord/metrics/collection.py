"""MetricCollection: metrics synchronised together.

One sync of a collection issues one collective per reduce op for all of its
metrics: every sum state of every metric in one all_reduce_multi, every max
in one, every min in one, every Cat state in one all-gather (after the small
header exchange that checks every rank holds the same metrics).

Members keep their own homes (see concord.metrics.base): they may live in
different array libraries and on different devices, say a NumPy Cat of
sample ids beside torch CUDA counts. A sync reduces each device's states in
their own collectives: one per reduce op and device (host states, NumPy
and torch alike, together; GPU states through NCCL). Ranks must agree on
which states are on the host and which on a GPU (the sync's fingerprint
includes it: MismatchError otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Metric
from .sync import start_sync

__all__ = ["MetricCollection"]


class MetricCollection(Mapping):
    """A read-only mapping {name: Metric} with the Metric lifecycle.

    Ranks must hold collections with the same names and metric kinds;
    otherwise a sync raises MismatchError on every rank (the order in which
    the dict was built does not matter)."""

    def __init__(self, metrics):
        metrics = dict(metrics)
        for name, metric in metrics.items():
            if not isinstance(name, str):
                raise ValueError(f"MetricCollection: names must be strings, got {name!r}")
            if not isinstance(metric, Metric):
                raise ValueError(f"MetricCollection: {name!r} is a {type(metric).__name__}, "
                                 "not a concord.metrics.Metric")
        if len({id(m) for m in metrics.values()}) != len(metrics):
            raise ValueError("MetricCollection: a metric object appears under two names")
        # Sorted names: ranks agree on the sync layout however they built the dict.
        self._metrics = {name: metrics[name] for name in sorted(metrics)}

    def __getitem__(self, name):
        return self._metrics[name]

    def __iter__(self):
        return iter(self._metrics)

    def __len__(self):
        return len(self._metrics)

    def __repr__(self):
        return f"MetricCollection({', '.join(f'{n}={type(m).__name__}' for n, m in self.items())})"

    def update(self, *args, **kwargs):
        """Updates every metric with the same arguments. Inputs of another
        home than a member's raise ValueError before any member is updated."""
        inputs = (*args, *kwargs.values())
        home = unknown = object()
        for metric in self._metrics.values():
            metric._check_idle("update")
            if home is unknown:  # the inputs' home, found once (the first member names errors)
                home = metric._input_home(inputs)
            metric._check_input_home(home)
        for metric in self._metrics.values():
            metric.update(*args, **kwargs)

    def trigger_sync(self, comm=None):
        """Starts syncing every metric: one asynchronous collective per reduce op."""
        for metric in self._metrics.values():
            metric._check_idle("trigger_sync")
        entries = {name: metric._entries((name,)) for name, metric in self._metrics.items()}
        pending = start_sync([e for part in entries.values() for e in part], comm)
        for name, metric in self._metrics.items():
            metric._hand_over(pending, entries[name])

    def wait_sync(self, comm=None):
        """Completes the sync of every metric; on failure every metric keeps
        its window and the first error is raised. `comm`, when given, must
        be the communicator of the sync (as Metric.wait_sync)."""
        waiting = [m for m in self._metrics.values() if m._pending is not None]
        if not waiting:
            raise RuntimeError("MetricCollection.wait_sync() without trigger_sync()")
        waiting[0]._pending[0].check_comm(comm, "MetricCollection.wait_sync")
        first_error = None
        for metric in waiting:
            try:
                metric.wait_sync()
            except BaseException as exc:  # the others still restore their windows
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def sync(self, comm=None):
        self.trigger_sync(comm)
        self.wait_sync()

    def to(self, device):
        """Moves every metric's states to `device` (see Metric.to) and
        returns the collection; an unknown or absent device moves none."""
        homes = []
        for metric in self._metrics.values():
            metric._check_idle("to")
            homes.append(metric._home_for(device))
        for metric, home in zip(self._metrics.values(), homes):
            metric._move_to(home)
        return self

    def compute(self):
        return {name: metric.compute() for name, metric in self._metrics.items()}

    def reset(self):
        for metric in self._metrics.values():
            metric.reset()

    def state_dict(self):
        return {name: metric.state_dict() for name, metric in self._metrics.items()}

    def load_state_dict(self, state_dict):
        if set(state_dict) != set(self._metrics):
            raise ValueError(f"state_dict has metrics {sorted(state_dict)}, "
                             f"expected {sorted(self._metrics)}")
        for name, metric in self._metrics.items():
            metric.load_state_dict(state_dict[name])
