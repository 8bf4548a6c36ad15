"""What the launchers of a job on several nodes tell each other through the
job's store: which node's rank failed first.

The first launcher to see one of its ranks fail claims the record (an add
on a counter: the first gets 1) and writes "node K rank R failed: <cause>";
every launcher watches for that record and, when another node wrote it,
stops its own ranks and reports it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from concord import _capi
from concord.errors import CollectiveTimeoutError, ConcordError

_CLAIM_KEY = "concord-run/failures"
_RECORD_KEY = "concord-run/first-failure"
# How long one wait for the record lasts before the watcher looks whether
# it should stop; the record itself wakes it at once.
_WAIT_S = 1.0
# How long a launcher that lost the claim waits for the winner's record.
_RECORD_WAIT_S = 5.0


_RECORD = re.compile(r"node (\d+) rank (\d+) failed: (.*)", re.DOTALL)


def record(node: int, rank: int, cause: str) -> str:
    return f"node {node} rank {rank} failed: {cause}"


def heading(text: str) -> str:
    """A record as the first line of a launcher's report."""
    node, rank, cause = _RECORD.fullmatch(text).groups()
    return f"node {node} rank {rank} failed first ({cause})"


class NodeWatch:
    """Watches the job's store for the first failure of any node; calls
    on_record(text) from its own thread when another node wrote it."""

    def __init__(self, host: str, port: int, token: str, node: int, connect_timeout_s: float,
                 on_record: Callable[[str], None]):
        self._address = (host, port, token)
        self._node = node
        self._connect_timeout_s = connect_timeout_s
        self._on_record = on_record
        self._stopped = threading.Event()
        self._published: str | None = None
        self._thread = threading.Thread(target=self._watch, name="concord-run node watch",
                                        daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            with _capi.Store(*self._address, self._connect_timeout_s) as store:
                while not self._stopped.is_set():
                    try:
                        text = bytes(store.get(_RECORD_KEY, timeout=_WAIT_S)).decode()
                    except CollectiveTimeoutError:
                        continue
                    if text != self._published:
                        self._on_record(text)
                    return
        except ConcordError:
            # The store is gone (node 0's launcher ended) or never came:
            # the ranks learn of that themselves.
            return

    def publish(self, rank: int, cause: str) -> str:
        """Claims the record for this node's `rank`, failed of `cause`;
        returns the record that stands: this one, or another node's that
        came first. Without the store, this node's own."""
        mine = record(self._node, rank, cause)
        try:
            with _capi.Store(*self._address, _RECORD_WAIT_S) as store:
                if store.add(_CLAIM_KEY, 1) == 1:
                    self._published = mine
                    store.set(_RECORD_KEY, mine.encode())
                    return mine
                return bytes(store.get(_RECORD_KEY, timeout=_RECORD_WAIT_S)).decode()
        except ConcordError:
            return mine

    def stop(self) -> None:
        self._stopped.set()
