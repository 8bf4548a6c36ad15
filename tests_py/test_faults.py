"""Fault injection with real processes: a rank that dies (SIGKILL, SIGTERM,
os._exit, an uncaught exception) before, during or between asynchronous
collectives on 3 and 4 ranks. Every survivor must get RemoteError naming
the failed rank within a few seconds, never a hang nor a timeout blaming
healthy ranks; every case is bounded in time and leaves no process or
shared-memory segment behind."""

from __future__ import annotations

import json
import signal
import textwrap
import time

import pytest

from helpers import RankProcesses, json_events

# The collectives' timeout in the ranks: a survivor that had to wait for it
# would take this long; every case must end well before.
_TIMEOUT_S = 20.0
# How long a survivor may take to fail after the victim died.
_DETECTED_S = 3.0
# How long the last survivor waits before joining the collective the victim
# dies in, so that the collective is in flight on the others.
_LATE_S = 0.5
# For an exception the late survivor waits longer: without an abort the
# victim would wait that long for it before exiting.
_LATE_EXCEPTION_S = 4.0

_RANK = textwrap.dedent("""
    import json, os, signal, sys, time
    import numpy as np
    import concord as cc

    victim, how, when = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    timeout, late_s = float(sys.argv[4]), float(sys.argv[5])
    cc.init(timeout=timeout)
    rank, size = cc.rank(), cc.world_size()
    data = np.full(1 << 18, rank + 1, np.float32)

    def report(**fields):
        print(json.dumps({"rank": rank, "time": time.monotonic(), **fields}), flush=True)

    def die():
        report(event="dying")
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        elif how == "exit":
            os._exit(3)
        elif how == "shutdown":  # the world closed while the exception is raised
            try:
                raise RuntimeError("the victim fails")
            finally:
                cc.shutdown()
        raise RuntimeError("the victim fails")

    def collectives(count):
        works = [cc.all_reduce(data, async_op=True) if i % 2 == 0
                 else cc.all_gather(data, async_op=True) for i in range(count)]
        for work in works:
            work.wait()

    if rank == victim and when == "before":
        die()
    late = rank == (size - 1 if victim != size - 1 else 0)
    if when == "during" and late:
        time.sleep(late_s)
    if rank == victim and when == "during":
        pending = [cc.all_reduce(data, async_op=True), cc.all_gather(data, async_op=True)]
        time.sleep(0.2)
        die()
    try:
        report(event="issuing")
        collectives(2)
        if rank == victim:  # between
            die()
        report(event="issuing")
        collectives(3)
        report(event="finished")
    except cc.ConcordError as exc:
        report(event="error", error=type(exc).__name__, message=str(exc))
""")


def _run_case(tmp_path, nranks, victim, how, when, timeout=_TIMEOUT_S):
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    late_s = _LATE_EXCEPTION_S if how in _RAISING else _LATE_S
    start = time.monotonic()
    with RankProcesses(script, nranks, victim, how, when, timeout, late_s) as ranks:
        finished = ranks.finish(timeout=_TIMEOUT_S + 30)
    elapsed = time.monotonic() - start
    return finished, ranks.leftover_segments, elapsed


_EXIT_CODES = {"sigkill": -signal.SIGKILL, "sigterm": -signal.SIGTERM, "exit": 3,
               "exception": 1, "shutdown": 1}
# Ways of dying by an exception: the victim aborts its communicators.
_RAISING = ("exception", "shutdown")


@pytest.mark.parametrize("nranks, victim, how, when", [
    pytest.param(nranks, victim, how, when, id=f"{how}-{when}-{nranks}ranks")
    for nranks, victim in ((3, 1), (4, 2))
    for how in ("sigkill", "sigterm", "exit", "exception")
    for when in ("before", "during", "between")
] + [pytest.param(3, 1, "shutdown", "during", id="shutdown-during-3ranks")])
def test_a_dying_rank_fails_its_peers_at_once(tmp_path, nranks, victim, how, when):
    finished, leftover, elapsed = _run_case(tmp_path, nranks, victim, how, when)
    hung = [rank for rank, (code, _, _) in enumerate(finished) if code is None]
    assert not hung, f"ranks {hung} were still running after {elapsed:.0f} s: {finished}"
    code, stdout, stderr = finished[victim]
    assert code == _EXIT_CODES[how], stderr
    death = next(e["time"] for e in json_events(stdout) if e["event"] == "dying")
    if how in _RAISING:
        assert "RuntimeError: the victim fails" in stderr
    for rank, (code, stdout, stderr) in enumerate(finished):
        if rank == victim:
            continue
        assert code == 0, stderr
        events = json_events(stdout)
        error = events[-1]
        assert error["event"] == "error", (rank, events)
        assert error["error"] == "RemoteError", (rank, error)
        # An exception aborts the victim's communicators at once
        # (its queued work does not drain first): the peers are told so.
        named = f"rank {victim} aborted" if how in _RAISING else f"rank {victim}"
        assert named in error["message"], (rank, error)
        issued = max(e["time"] for e in events if e["event"] == "issuing")
        assert error["time"] - max(death, issued) < _DETECTED_S, (rank, error, death)
    assert leftover == []
    assert elapsed < _TIMEOUT_S


def test_an_infinite_timeout_still_detects_a_dead_peer(tmp_path):
    finished, leftover, elapsed = _run_case(tmp_path, 3, 1, "sigkill", "during",
                                            timeout=float("inf"))
    for rank in (0, 2):
        code, stdout, stderr = finished[rank]
        assert code == 0, stderr
        error = json_events(stdout)[-1]
        assert error["error"] == "RemoteError" and "rank 1" in error["message"], error
    assert leftover == [] and elapsed < _TIMEOUT_S


# ---- a metric sync that fails part-way ------------------------------------------

_METRIC_RANK = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import numpy as np
    import concord as cc
    from concord import metrics as M

    CLASSES, VICTIM = int(sys.argv[1]), int(sys.argv[2])
    os.environ["CONCORD_SHM_CMA_BYTES"] = sys.argv[3]
    DELAYS_S = [0.0, 0.001, 0.002, 0.005, 0.01]
    world = cc.init(timeout=30.0)
    rank, size = world.rank, world.size
    rng = np.random.default_rng(rank)

    def collection():
        return M.MetricCollection({"cm": M.ConfusionMatrix(CLASSES), "sum": M.Sum(),
                                   "max": M.Max(), "min": M.Min(), "cat": M.Cat()})

    def fill(metrics):
        n = 200_000
        metrics["cm"].update(rng.integers(0, CLASSES, n), rng.integers(0, CLASSES, n))
        for name in ("sum", "max", "min", "cat"):
            metrics[name].update(rng.normal(size=50))

    def windows(metrics):
        return {name: m.state_dict()["window"] for name, m in metrics.items()}

    def unchanged(before, after):
        return all(np.array_equal(before[n][s], after[n][s]) for n in before for s in before[n])

    outcomes = []
    # Each attempt on a fresh communicator, which the victim aborts while
    # the sync is under way; the last one on the world, where it dies.
    for attempt, delay in enumerate([*DELAYS_S, None]):
        comm = world if delay is None else world.split(0)
        metrics = collection()
        fill(metrics)
        before = windows(metrics)
        try:
            # The failure may reach a survivor while it still starts the
            # collectives (trigger_sync raises), or while they run.
            metrics.trigger_sync(comm)
            if rank == VICTIM:
                if delay is None:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(delay)
                comm.abort()
            metrics.wait_sync()
            error = None
        except cc.ConcordError as exc:
            error = type(exc).__name__
        if rank != VICTIM:
            outcomes.append({"attempt": attempt, "error": error,
                             "unchanged": unchanged(before, windows(metrics))})
    print(json.dumps(outcomes), flush=True)
""")


# Through the segment, and reading the peers' buffers directly (a peer that
# dies during such a read must be told apart from a failed read).
@pytest.mark.parametrize("cma_bytes", [0, 65536])
def test_a_failed_metric_sync_leaves_every_window_as_it_was(tmp_path, cma_bytes):
    script = tmp_path / "metric_rank.py"
    script.write_text(_METRIC_RANK)
    with RankProcesses(script, 3, 1500, 2, cma_bytes) as ranks:
        finished = ranks.finish(timeout=120)
    for rank in (0, 1):
        code, stdout, stderr = finished[rank]
        assert code == 0, stderr
        outcomes = json.loads(stdout)
        failed = [o for o in outcomes if o["error"] is not None]
        # A sync may finish before an abort late in it; the victim's death
        # on the world, and most aborts, come while it runs.
        assert outcomes[-1] in failed and len(failed) >= 3, outcomes
        for outcome in failed:
            assert outcome["error"] == "RemoteError", outcome
            assert outcome["unchanged"], f"rank {rank}: {outcome}"
    assert finished[2][0] == -signal.SIGKILL
    assert ranks.leftover_segments == []
