"""concord-run: starts the ranks of a job on this node.

    concord-run -n 4 train.py --lr 0.1
    concord-run -n 4 -m mypackage.train --lr 0.1
    concord-run -n 4 ./allreduce               # any executable, not only Python
    python -m concord.run -n 4 train.py

Node 0 (or the only node) serves the rendezvous store from this launcher
process, bound only to --master-addr. Each rank gets RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and CONCORD_JOB_TOKEN,
so it only needs to call concord.init(). Output lines are prefixed with the
rank. When a rank fails, the others are stopped and the launcher reports
which rank failed first, how, and its last lines of output.

Several nodes: start one launcher per node with the same --nnodes,
--master-addr (an address of node 0 that the others can reach) and
--master-port, its own --node-rank, and the same CONCORD_JOB_TOKEN exported
on every node (for example CONCORD_JOB_TOKEN=$(openssl rand -hex 16), shared
through the job script); the store only serves clients that present it.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import BinaryIO, TextIO

from concord import _launching

_PROG = "concord-run"
# How long to wait for a stopped rank's output pipes to drain; a grandchild
# that escaped its process group may hold them open forever.
_DRAIN_TIMEOUT_S = 2.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Start the ranks of a concord job on this node.",
        epilog="Several nodes need the same CONCORD_JOB_TOKEN exported on every node.",
    )
    parser.add_argument("-n", "--nproc-per-node", "--nprocs", dest="nprocs", type=int, default=1,
                        help="ranks on this node (default 1)")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes in the job (default 1)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's index (default 0)")
    parser.add_argument("--master-addr", default=None,
                        help="address node 0 serves the store on (default 127.0.0.1 on one node)")
    parser.add_argument("--master-port", type=int, default=None,
                        help="store port (default: a free port on one node; "
                             "required with --nnodes > 1)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="timeout in seconds of every blocking wait in the ranks "
                             "(sets CONCORD_TIMEOUT)")
    parser.add_argument("-m", "--module", action="store_true",
                        help="run the target as a Python module, like python -m")
    parser.add_argument("target", nargs=argparse.REMAINDER,
                        help="script (or executable, or module with -m) and its arguments")
    return parser


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.target[:1] == ["--"]:
        args.target = args.target[1:]
    if not args.target:
        parser.error("nothing to run: give a script, an executable or -m module")
    if args.nprocs < 1:
        parser.error("-n must be at least 1")
    if args.nnodes < 1:
        parser.error("--nnodes must be at least 1")
    if not 0 <= args.node_rank < args.nnodes:
        parser.error(f"--node-rank must be in [0, {args.nnodes})")
    if args.nnodes > 1:
        if args.master_addr is None or args.master_port is None:
            parser.error("--nnodes > 1 needs --master-addr and --master-port")
        if not os.environ.get("CONCORD_JOB_TOKEN"):
            parser.error("--nnodes > 1 needs the same CONCORD_JOB_TOKEN exported on every node")
    if args.master_port is not None and not 0 <= args.master_port <= 65535:
        parser.error("--master-port must be in [0, 65535]")
    if args.nnodes > 1 and args.master_port == 0:
        parser.error("--nnodes > 1 needs a fixed --master-port, not 0")
    if args.master_addr is None:
        args.master_addr = _launching.DEFAULT_MASTER_ADDR
    if args.master_port is None:
        args.master_port = 0
    return args


def _rank_command(target: list[str], module: bool) -> list[str]:
    """Python scripts and modules run under this interpreter; any other
    executable (a C program, say) runs as it is."""
    if module:
        return [sys.executable, "-m", *target]
    program, *rest = target
    if not program.endswith(".py") and shutil.which(program):
        return [program, *rest]
    return [sys.executable, program, *rest]


@dataclass
class _Rank:
    rank: int
    process: subprocess.Popen
    tail: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=_launching.TAIL_LINES))
    readers: list[threading.Thread] = field(default_factory=list)

    def signal(self, signum: int) -> None:
        # Each rank leads its own process group, so this also reaches the
        # processes it started (data loader workers, say).
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


_PIECE = re.compile(rb"[^\r\n]*[\r\n]")


def _segments(pipe: BinaryIO):
    """Yields a rank's output in pieces ending with a newline or a carriage
    return, so a progress bar drawn with \\r stays live through the launcher."""
    pending = b""
    fd = pipe.fileno()
    while chunk := os.read(fd, 65536):
        pending += chunk
        start = 0
        for match in _PIECE.finditer(pending):
            yield match.group()
            start = match.end()
        pending = pending[start:]
    if pending:
        yield pending + b"\n"


def _pump(pipe: BinaryIO, stream: TextIO, prefix: bytes, tail: collections.deque,
          lock: threading.Lock) -> None:
    """Copies one rank's stdout or stderr to ours, prefixed piece by piece."""
    out = getattr(stream, "buffer", None)
    with pipe:
        for piece in _segments(pipe):
            with lock:
                if out is not None:
                    out.write(prefix + piece)
                else:
                    stream.write((prefix + piece).decode(errors="replace"))
                stream.flush()
            if piece.endswith(b"\n"):
                tail.append(piece.decode(errors="replace"))


def _start_rank(rank: int, command: list[str], env: dict[str, str], exits: queue.Queue,
                lock: threading.Lock) -> _Rank:
    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    started = _Rank(rank, process)
    prefix = f"[{rank}] ".encode()
    for pipe, stream in ((process.stdout, sys.stdout), (process.stderr, sys.stderr)):
        reader = threading.Thread(target=_pump, args=(pipe, stream, prefix, started.tail, lock),
                                  name=f"{_PROG} rank {rank} output", daemon=True)
        reader.start()
        started.readers.append(reader)
    threading.Thread(target=lambda: exits.put((rank, process.wait())),
                     name=f"{_PROG} rank {rank} waiter", daemon=True).start()
    return started


def _stop(ranks: dict[int, _Rank], running: set[int], exits: queue.Queue) -> None:
    """SIGTERM to every running rank, SIGKILL to those still there after the
    grace period; returns once all have exited."""
    for rank in running:
        ranks[rank].signal(signal.SIGTERM)
    deadline = time.monotonic() + _launching.STOP_GRACE_S
    while running:
        try:
            rank, _ = exits.get(timeout=max(0.0, deadline - time.monotonic()))
            running.discard(rank)
        except queue.Empty:
            for rank in running:
                ranks[rank].signal(signal.SIGKILL)
            deadline = float("inf")


def _supervise(ranks: dict[int, _Rank], exits: queue.Queue) -> tuple[int, int, list[int]] | None:
    """Waits for every rank. Returns (rank, exit code, ranks stopped) for the
    first rank that failed, or None when all succeeded."""
    running = set(ranks)
    while running:
        rank, code = exits.get()
        running.discard(rank)
        if code != 0:
            stopped = sorted(running)
            _stop(ranks, running, exits)
            return rank, code, stopped
    return None


def _forward_signals(ranks: dict[int, _Rank]) -> dict:
    """Ctrl-C (SIGINT) and SIGTERM go on to the ranks, which run in their own
    process groups; a second Ctrl-C kills them. Returns the handlers replaced."""
    interrupts = 0

    def forward(signum, _frame):
        nonlocal interrupts
        if signum == signal.SIGINT:
            interrupts += 1
            if interrupts > 1:
                signum = signal.SIGKILL
        for rank in list(ranks.values()):
            if rank.process.poll() is None:
                rank.signal(signum)

    return {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}


def _drain(ranks: dict[int, _Rank]) -> None:
    """Waits until the ranks' remaining output has been copied."""
    deadline = time.monotonic() + _DRAIN_TIMEOUT_S
    for started in ranks.values():
        for reader in started.readers:
            reader.join(max(0.0, deadline - time.monotonic()))


def _report(ranks: dict[int, _Rank], failure: tuple[int, int, list[int]]) -> str:
    rank, code, stopped = failure
    report = _launching.failure_report(
        rank, _launching.describe_exit(code), stopped,
        f"last lines of rank {rank}", list(ranks[rank].tail))
    # Output lines are indented; the report's own lines carry our name.
    return "\n".join(line if line.startswith(" ") else f"{_PROG}: {line}"
                     for line in report.splitlines())


def _run(args: argparse.Namespace) -> int:
    world_size = args.nnodes * args.nprocs
    token = _launching.job_token()
    server = None
    if args.node_rank == 0:
        try:
            server = _launching.serve_store(args.master_addr, args.master_port, token)
        except RuntimeError as exc:
            print(f"{_PROG}: cannot serve the rendezvous store on "
                  f"{args.master_addr}:{args.master_port}: {exc}", file=sys.stderr)
            return 1
    port = server.port if server is not None else args.master_port
    command = _rank_command(args.target, args.module)
    ranks: dict[int, _Rank] = {}
    exits: queue.Queue = queue.Queue()
    lock = threading.Lock()
    previous_handlers = _forward_signals(ranks)
    try:
        for local_rank in range(args.nprocs):
            rank = args.node_rank * args.nprocs + local_rank
            env = dict(os.environ)
            env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach us as they are printed
            _launching.apply_rank_environment(env, _launching.rank_environment(
                rank=rank, local_rank=local_rank, world_size=world_size,
                local_world_size=args.nprocs, master_addr=args.master_addr,
                master_port=port, token=token, timeout_s=args.timeout))
            ranks[rank] = _start_rank(rank, command, env, exits, lock)
        failure = _supervise(ranks, exits)
    except BaseException:
        _stop(ranks, {r for r, started in ranks.items() if started.process.poll() is None}, exits)
        raise
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
        if server is not None:
            server.close()
    _drain(ranks)
    if failure is None:
        return 0
    with lock:
        sys.stdout.flush()
        print(_report(ranks, failure), file=sys.stderr, flush=True)
    code = failure[1]
    return code if code > 0 else 1


def main(argv: list[str] | None = None) -> int:
    return _run(_parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
