"""What concord-run (run.py) and concord.launch() (notebook.py) share: the
rendezvous store the launcher serves, the environment each rank gets, and
the report printed when a rank fails."""

from __future__ import annotations

import os
import secrets
import signal
import socket
from collections.abc import Iterable, Mapping, MutableMapping

from concord import _capi

DEFAULT_MASTER_ADDR = "127.0.0.1"
# How long a rank may take to exit after SIGTERM before it gets SIGKILL.
STOP_GRACE_S = 5.0
# Lines of output kept per rank for the failure report.
TAIL_LINES = 40

# Rendezvous settings that take precedence over RANK, WORLD_SIZE, ... in
# concord's bootstrap; a rank must not inherit them from whatever started
# the launcher (a rank of another job, say).
_SHADOWING_VARIABLES = (
    "CONCORD_RANK",
    "CONCORD_WORLD_SIZE",
    "CONCORD_LOCAL_RANK",
    "CONCORD_MASTER_ADDR",
    "CONCORD_MASTER_PORT",
)


def job_token() -> str:
    """The job's store token: CONCORD_JOB_TOKEN when set (every node of a
    multi-node job must share it), else a fresh random one."""
    return os.environ.get("CONCORD_JOB_TOKEN") or secrets.token_hex(16)


def serve_store(host: str, port: int, token: str):
    """Serves the rendezvous store on host:port only (port 0: a free one)."""
    return _capi.StoreServer(host, port, token)


def free_port(host: str) -> int:
    """A port free on `host` now, for torch's store (MASTER_PORT), which
    the ranks' torch.distributed serves, not the launcher."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def rank_environment(
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    master_addr: str,
    master_port: int,
    store_port: int,
    token: str,
    timeout_s: float | None = None,
) -> dict[str, str]:
    """The variables concord.init() reads in one rank of a launched job,
    which torch.distributed's env:// initialisation reads too: MASTER_PORT
    is left to torch's store, concord's is on CONCORD_MASTER_PORT, so one
    job can use both."""
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "CONCORD_MASTER_ADDR": master_addr,
        "CONCORD_MASTER_PORT": str(store_port),
        "CONCORD_JOB_TOKEN": token,
        # The launcher already serves the store; rank 0 must not bind it too.
        "CONCORD_STORE_SERVER": "launcher",
    }
    if timeout_s is not None:
        env["CONCORD_TIMEOUT"] = repr(float(timeout_s))
    return env


def apply_rank_environment(environ: MutableMapping[str, str], values: Mapping[str, str]) -> None:
    for name in _SHADOWING_VARIABLES:
        environ.pop(name, None)
    environ.update(values)


def describe_exit(exitcode: int) -> str:
    """'exit code 3' or 'signal SIGKILL' for a Popen/Process exit code."""
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        return f"signal {signal.Signals(-exitcode).name}"
    except ValueError:
        return f"signal {-exitcode}"


def failure_report(
    rank: int,
    cause: str,
    stopped: Iterable[int],
    detail_title: str,
    detail_lines: Iterable[str],
    *,
    heading: str | None = None,
) -> str:
    """Names the first failed rank, why it failed, which ranks were stopped
    because of it, and its last output (or traceback). `heading` replaces
    the first line (a job on several nodes names the node)."""
    stopped = sorted(stopped)
    lines = [heading or f"rank {rank} failed first ({cause})"]
    if stopped:
        lines.append("stopped the other ranks: " + ", ".join(map(str, stopped)))
    detail = [line.rstrip("\n") for line in detail_lines]
    if detail:
        lines.append(f"{detail_title}:")
        lines.extend("  " + line for line in detail)
    else:
        lines.append(f"{detail_title}: (none)")
    return "\n".join(lines)
