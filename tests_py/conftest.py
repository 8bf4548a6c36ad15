"""Shared fixtures: a clean job environment, a world of one in this process,
and ranks run as threads of this process (cheap multi-rank checks)."""

import os
import re
import secrets
import threading

import pytest

import concord as cc
from concord import _capi

# Rendezvous settings the test process may have inherited (from a launcher
# running the suite, say); every job here starts from a clean slate.
_JOB_VARIABLE = re.compile(r"(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT"
                           r"|CONCORD_.*|OMPI_.*|PMI_.*|SLURM_.*)")


@pytest.fixture(autouse=True)
def _clean_job(monkeypatch):
    for name in list(os.environ):
        if _JOB_VARIABLE.fullmatch(name):
            monkeypatch.delenv(name)
    yield
    cc.shutdown()


@pytest.fixture
def world1():
    """This process as a world of one."""
    return cc.init(timeout=30.0)


def _run_thread_ranks(nranks, fn, *, timeout=30.0):
    """Runs fn(comm) on `nranks` threads, each a rank of one communicator
    meeting through a store served here; returns the results in rank order
    and re-raises the first rank's exception, if any."""
    token = secrets.token_hex(8)
    results = [None] * nranks
    errors = [None] * nranks

    with _capi.StoreServer("127.0.0.1", 0, token) as server:
        def rank_main(rank):
            try:
                with _capi.Store("127.0.0.1", server.port, token, timeout) as store:
                    handle = _capi.Comm.from_store(store, "threads", rank, nranks, timeout)
                    with cc.Communicator(handle) as comm:
                        results[rank] = fn(comm)
            except BaseException as exc:  # reported by the caller
                errors[rank] = exc

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(nranks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for error in errors:
        if error is not None:
            raise error
    return results


@pytest.fixture
def thread_ranks():
    """run(nranks, fn) -> [fn(comm) per rank]: ranks as threads of this process."""
    return _run_thread_ranks
