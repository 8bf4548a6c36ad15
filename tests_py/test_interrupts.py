"""Ctrl-C (or any signal whose handler raises) to a rank blocked in a
collective, with real processes: the rank raises what the handler raised
within a second, and its peer fails at once instead of waiting for the
timeout."""

import json
import signal
import textwrap
import time

import pytest

from helpers import RankProcesses, json_events

_BLOCKED = textwrap.dedent("""
    import json, signal, sys, time
    import numpy as np
    import concord as cc

    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop(f"signal {signum}")

    how = sys.argv[1]
    signal.signal(signal.SIGUSR1, stop)
    # Python's own Ctrl-C handler, also where the suite runs as a background
    # job, whose children start with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cc.init(timeout=60.0)
    rank = cc.rank()

    def report(**fields):
        print(json.dumps({"rank": rank, "time": time.monotonic(), **fields}), flush=True)

    x = np.ones(1000, np.float32)
    if rank == 1:
        time.sleep(2.0)  # rank 0 is blocked meanwhile, then interrupted
        how = "blocking"
    else:
        report(event="blocking")
    try:
        if how == "wait":
            cc.all_reduce(x, async_op=True).wait()
        elif how == "queued":
            work = cc.all_reduce(x, async_op=True)
            cc.all_gather(x)  # blocking, behind the queued one
        elif how == "dropped":
            # A Work dropped unfinished waits for its collective (its arrays
            # are released next) where it cannot raise: the interruption is
            # raised in the Python code that runs next.
            cc.all_reduce(x, async_op=True)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                pass
        else:
            cc.all_reduce(x)
        report(event="finished")
    except BaseException as exc:
        report(event="raised", error=type(exc).__name__, message=str(exc))
""")


@pytest.mark.parametrize("how, signum, raised", [
    ("blocking", signal.SIGINT, "KeyboardInterrupt"),
    ("wait", signal.SIGINT, "KeyboardInterrupt"),
    ("queued", signal.SIGINT, "KeyboardInterrupt"),
    ("dropped", signal.SIGINT, "KeyboardInterrupt"),
    ("blocking", signal.SIGUSR1, "Stop"),  # what the user's own handler raised
])
def test_a_signal_interrupts_a_blocked_collective(tmp_path, how, signum, raised):
    script = tmp_path / "blocked.py"
    script.write_text(_BLOCKED)
    with RankProcesses(script, 2, how) as ranks:
        blocked = ranks.processes[0]
        line = blocked.stdout.readline()
        assert json.loads(line)["event"] == "blocking", line
        time.sleep(0.3)  # into the wait
        sent = time.monotonic()
        blocked.send_signal(signum)
        finished = ranks.finish(timeout=30)
    code, stdout, stderr = finished[0]
    assert code == 0, stderr
    event = json_events(stdout)[-1]
    assert event["event"] == "raised" and event["error"] == raised, event
    assert event["time"] - sent < 1.0
    code, stdout, stderr = finished[1]
    assert code == 0, stderr
    peer = json_events(stdout)[-1]
    assert peer["error"] == "RemoteError" and "rank 0" in peer["message"], peer
    assert ranks.leftover_segments == []
