"""Rank processes never outlive their launcher (Linux).

A rank asks the kernel to kill it when its launcher dies, whatever kills
the launcher (SIGKILL included, which runs no clean-up of the launcher's
own): the parent-death signal. concord-run also makes itself a child
subreaper, so that what a rank started and left behind, even in a session
of its own, becomes concord-run's child once the rank is gone, and is
killed when the job ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["become_subreaper", "die_with_parent", "kill_children"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# prctl, looked up once: die_with_parent runs between fork and exec, where
# nothing should be loaded or locked.
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) \
    if sys.platform.startswith("linux") else None


def die_with_parent(parent_pid: int | None) -> None:
    """SIGKILL for this process when the thread that started it exits.
    `parent_pid` is that parent's pid, when known: if it already exited
    (this process now has another parent), this process exits at once."""
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def become_subreaper() -> None:
    """Orphaned descendants of this process become its children."""
    if _prctl is not None:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children() -> list[int]:
    me = os.getpid()
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                # pid (comm) state ppid ...: comm may hold spaces and parentheses.
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            children.append(int(entry))
    return children


def kill_children(rounds: int = 100) -> list[int]:
    """SIGKILLs and reaps every child of this process, and then those that
    became its children as their parents died (a subreaper's); returns
    their pids. Call it only once the children it waits for otherwise
    (the ranks) were reaped."""
    killed = []
    for _ in range(rounds):
        children = _children()
        if not children:
            break
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                continue
            killed.append(pid)
    return killed
