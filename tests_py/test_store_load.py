"""The store serves a whole job that meets at once: with the process's soft
descriptor limit below the number of ranks, it raises the limit (up to the
hard one) rather than leave ranks unserved in the accept queue, where every
rank would wait for them until the timeout."""

from __future__ import annotations

import resource
import secrets
import subprocess
import sys
import threading

import pytest

from concord import _capi

RANKS = 200
SOFT_LIMIT = 64  # far fewer descriptors than RANKS connections
TIMEOUT_S = 20.0

# The server's process: lowers its own soft limit, serves, prints its port,
# and at the end the soft limit it finished with.
SERVER = """
import resource, sys
from concord import _capi
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, ({soft_limit}, hard))
server = _capi.StoreServer("127.0.0.1", 0, sys.argv[1])
print(server.port, flush=True)
sys.stdin.read()
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], flush=True)
server.close()
"""


def _rank(port: int, token: str, rank: int, records: list[bytes], seen: list, errors: list):
    try:
        with _capi.Store("127.0.0.1", port, token, TIMEOUT_S) as store:
            store.set(f"host/{rank}", records[rank])
            seen[rank] = [records[rank] if q == rank else bytes(store.get(f"host/{q}"))
                          for q in range(RANKS)]
    except Exception as e:  # noqa: BLE001 - reported below, per rank
        errors[rank] = f"{type(e).__name__}: {e}"


def test_a_store_below_its_descriptor_limit_serves_every_rank(rng):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2 * RANKS:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves no room above {2 * RANKS}")
    token = secrets.token_hex(16)
    server = subprocess.Popen([sys.executable, "-c", SERVER.format(soft_limit=SOFT_LIMIT), token],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        records = [rng.bytes(int(rng.integers(1, 100))) for _ in range(RANKS)]
        seen: list = [None] * RANKS
        errors: list = [None] * RANKS
        threads = [threading.Thread(target=_rank, args=(port, token, r, records, seen, errors))
                   for r in range(RANKS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(3 * TIMEOUT_S)
        assert not any(t.is_alive() for t in threads)
        assert [e for e in errors if e] == []
        assert seen == [records] * RANKS
        final_soft_limit, _ = server.communicate("", timeout=TIMEOUT_S)
        assert int(final_soft_limit) > RANKS
    finally:
        server.kill()
        server.wait()
