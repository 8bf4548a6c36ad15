"""concord.launch(): run a function as the ranks of a job, from a notebook.

    def work(n):
        import concord, numpy as np
        concord.init()
        return concord.all_reduce(np.full(n, concord.rank(), np.float32))

    results = concord.launch(work, 4, 1000)     # one result per rank

By default the ranks are forked from the calling process, so `fn` may be
defined in the notebook itself. Forking is unsafe once the process runs
threads a library cannot take into a child: torch's CPU thread pool (a
forked rank's first parallel torch op hangs, as with plain
multiprocessing), or JAX's. ``start_method="spawn"`` (or "forkserver")
starts fresh interpreters instead; `fn` and the arguments are then pickled
by reference, so `fn` must be importable (defined in a module, not in the
notebook). launch warns (UnsafeForkWarning) when it forks a process that
imported torch with more than one intra-op thread.

Results and exceptions come back pickled. The ranks die with the calling
process, however it ends (a killed notebook kernel included).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any

from concord import _launching, _processes
from concord.communicator import abort_open_communicators

__all__ = ["launch", "LaunchError", "UnsafeForkWarning"]

START_METHODS = ("fork", "spawn", "forkserver")


class UnsafeForkWarning(RuntimeWarning):
    """concord.launch forks a process whose threads a forked rank may need
    (torch's CPU thread pool): the rank can hang."""


class LaunchError(RuntimeError):
    """A rank of concord.launch failed: raised an exception or died.

    Attributes: rank (the first rank that failed), exitcode (None when the
    rank raised), exc_type (the exception's qualified name, None when it
    died) and details (its traceback, or an explanation)."""

    def __init__(self, message: str, rank: int | None = None, exitcode: int | None = None,
                 exc_type: str | None = None, details: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.exc_type = exc_type
        self.details = details

    def __reduce__(self):
        return type(self), (str(self), self.rank, self.exitcode, self.exc_type, self.details)


def _exception_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass
class _Outcome:
    """What a rank sends back, or what the launcher saw of it."""

    ok: bool
    result: Any = None
    exc_type: str | None = None
    message: str = ""
    details: str = ""
    exitcode: int | None = None
    # CLOCK_MONOTONIC is system-wide, so ranks' times compare; it decides
    # which rank failed first when several failures are seen at once.
    time: float = field(default_factory=time.monotonic)

    @classmethod
    def from_exception(cls, exc: BaseException, message: str | None = None) -> _Outcome:
        return cls(False, exc_type=_exception_name(exc),
                   message=str(exc) if message is None else message,
                   details="".join(traceback.format_exception(exc)))


def _rank_main(conn, fn, args, launcher_pid) -> None:
    """Body of one rank: wait for the rendezvous environment, run fn, send
    back its outcome. `launcher_pid` is the parent's pid when the launcher
    is the parent (None when a fork server is)."""
    _processes.die_with_parent(launcher_pid)
    try:
        env = conn.recv()
    except EOFError:  # the launcher gave up before the store was up
        os._exit(1)
    _launching.apply_rank_environment(os.environ, env)
    try:
        outcome = _Outcome(True, result=fn(*args))
    except BaseException as exc:
        # The peers learn at once that this rank failed.
        abort_open_communicators()
        # The traceback starts in fn, not in this function.
        outcome = _Outcome.from_exception(exc.with_traceback(exc.__traceback__.tb_next))
    try:
        conn.send(outcome)
    except Exception as exc:
        conn.send(_Outcome.from_exception(exc, f"cannot send the result back: {exc}"))
        outcome.ok = False
    if not outcome.ok:
        raise SystemExit(1)


def _warn_if_fork_is_unsafe() -> None:
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else 1
    if threads > 1:
        warnings.warn(
            f"concord.launch forks the ranks from a process that imported torch, which runs CPU "
            f"ops on {threads} threads: once its thread pool has started, a forked rank's first "
            "parallel torch op hangs. Pass start_method='spawn' (fn must then be importable, "
            "not defined in the notebook), or call torch.set_num_threads(1) before torch's "
            "first op", UnsafeForkWarning, stacklevel=3)


def _start_ranks(ctx, fn, nprocs: int, args: tuple):
    """Starts the ranks before the store server starts, so no forked child
    inherits its threads or its listening socket."""
    processes, conns = [], []
    launcher_pid = None if ctx.get_start_method() == "forkserver" else os.getpid()
    # A multi-threaded caller (a notebook kernel) makes Python 3.12+ warn on
    # any fork; forking is what launch promises by default (with the
    # warning above where it is known to be unsafe), and no thread of
    # concord's runs yet.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                category=DeprecationWarning)
        for rank in range(nprocs):
            parent_end, child_end = ctx.Pipe()
            process = ctx.Process(target=_rank_main, args=(child_end, fn, args, launcher_pid),
                                  name=f"concord rank {rank}")
            processes.append(process)
            conns.append(parent_end)
            process.start()
            # Only the child may hold its end, so its death shows as EOF here.
            child_end.close()
    return processes, conns


def _receive(process, conn) -> _Outcome | None:
    """One rank's outcome once it sent one or exited; None while running."""
    if not conn.poll():
        if process.is_alive():
            return None
        # The rank may have sent its outcome just before exiting.
        if not conn.poll():
            return _died(process)
    try:
        return conn.recv()
    except (EOFError, OSError):
        return _died(process)
    except Exception as exc:
        return _Outcome.from_exception(exc, f"cannot receive the result: {exc}")


def _died(process) -> _Outcome:
    process.join(_launching.STOP_GRACE_S)
    return _Outcome(False, exitcode=process.exitcode,
                    details="exited without returning a result")


def _send_environment(conn, env) -> None:
    try:
        conn.send(env)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the rank is already dead; collecting its outcome reports it


def _collect(processes, conns):
    """Returns (results, None), or (partial results, (rank, outcome)) for the
    first rank that failed."""
    results = [None] * len(processes)
    pending = set(range(len(processes)))
    while pending:
        multiprocessing.connection.wait(
            [conns[r] for r in pending] + [processes[r].sentinel for r in pending])
        failures = []
        for rank in sorted(pending):
            outcome = _receive(processes[rank], conns[rank])
            if outcome is None:
                continue
            pending.discard(rank)
            if outcome.ok:
                results[rank] = outcome.result
            else:
                failures.append((rank, outcome))
        if failures:
            return results, min(failures, key=lambda failure: failure[1].time)
    return results, None


def _stop(processes, grace_s: float) -> list[int]:
    """Gives the ranks grace_s to exit by themselves, then SIGTERM, then
    SIGKILL after the grace period; returns the ranks that were signalled."""
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    running = [rank for rank, process in enumerate(processes) if process.is_alive()]
    for rank in running:
        processes[rank].terminate()
    for rank in running:
        processes[rank].join(_launching.STOP_GRACE_S)
        if processes[rank].is_alive():
            processes[rank].kill()
            processes[rank].join()
    return running


def _launch_error(rank: int, outcome: _Outcome, signalled: list[int]) -> LaunchError:
    # The failed rank may still have been on its way out when signalled.
    stopped = [other for other in signalled if other != rank]
    if outcome.exc_type is not None:
        cause = f"raised {outcome.exc_type}"
        if outcome.message:
            cause += f": {outcome.message}"
        report = _launching.failure_report(rank, cause, stopped, "traceback",
                                           outcome.details.splitlines())
    else:
        report = _launching.failure_report(rank, _launching.describe_exit(outcome.exitcode),
                                           stopped, "details", [outcome.details])
    return LaunchError(report, rank=rank, exitcode=outcome.exitcode,
                       exc_type=outcome.exc_type, details=outcome.details)


def launch(fn, nprocs: int, *args, start_method: str = "fork"):
    """Runs fn(*args) in nprocs processes, the ranks of one job (each only
    needs concord.init()), and returns their return values in rank order.
    When a rank raises or dies, stops the others and raises LaunchError
    naming the first rank that failed.

    start_method: "fork" (the default: `fn` may be defined in the notebook),
    or "spawn" / "forkserver" (fresh interpreters: `fn` and `args` are
    pickled by reference, so `fn` must be importable), for a process where
    forking is unsafe (torch or JAX already ran threads in it)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive integer, got {nprocs!r}")
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {', '.join(map(repr, START_METHODS))}, "
                         f"got {start_method!r}")
    if start_method == "fork":
        _warn_if_fork_is_unsafe()
    ctx = multiprocessing.get_context(start_method)
    processes, conns = _start_ranks(ctx, fn, nprocs, args)
    server = None
    try:
        token = _launching.job_token()
        master_addr = _launching.DEFAULT_MASTER_ADDR
        server = _launching.serve_store(master_addr, 0, token)
        master_port = _launching.free_port(master_addr)
        for rank, conn in enumerate(conns):
            _send_environment(conn, _launching.rank_environment(
                rank=rank, local_rank=rank, world_size=nprocs, local_world_size=nprocs,
                master_addr=master_addr, master_port=master_port, store_port=server.port,
                token=token))
        results, failure = _collect(processes, conns)
        # Ranks that all succeeded get to finish exiting; after a failure the
        # others are stopped at once.
        stopped = _stop(processes, 0.0 if failure is not None else _launching.STOP_GRACE_S)
    except BaseException:
        _stop(processes, 0.0)
        raise
    finally:
        for conn in conns:
            conn.close()
        if server is not None:
            server.close()
    if failure is not None:
        raise _launch_error(*failure, stopped)
    return results


# The error is documented as concord.launch.LaunchError: the function carries it.
launch.LaunchError = LaunchError
