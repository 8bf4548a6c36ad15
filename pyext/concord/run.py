"""concord-run: starts the ranks of a job on this node.

    concord-run -n 4 train.py --lr 0.1
    concord-run -n 4 -m mypackage.train --lr 0.1
    concord-run -n 4 ./allreduce               # any executable, not only Python
    python -m concord.run -n 4 train.py

Node 0 (or the only node) serves concord's rendezvous store from this
launcher process, bound only to --master-addr, on its own port. Each rank
gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, CONCORD_MASTER_ADDR, CONCORD_MASTER_PORT and
CONCORD_JOB_TOKEN, so it only needs to call concord.init(); MASTER_ADDR
and MASTER_PORT are left to torch.distributed (init_process_group with
env:// serves torch's store there), concord's store being on
CONCORD_MASTER_PORT. Output lines are prefixed with the rank. When a rank
fails, the others are stopped (SIGTERM, then SIGKILL after a grace period)
and the launcher reports which rank failed first, how, and its last lines
of output.

A signal to the launcher (SIGINT, SIGTERM, SIGHUP) goes on to the ranks
(a second Ctrl-C kills them); once they have exited the launcher says so
and exits with 128 + the signal's number, as torchrun does. The ranks die
with the launcher even when it is killed outright, and what they started
and left behind is killed when the job ends.

Several nodes: start one launcher per node with the same --nnodes,
--master-addr (an address of node 0 that the others can reach) and
--master-port (torch's store; concord's is on --store-port, by default
--master-port + 1), its own --node-rank, and the same CONCORD_JOB_TOKEN
exported on every node (for example CONCORD_JOB_TOKEN=$(openssl rand -hex
16), shared through the job script); the store only serves clients that
present it. Node 0 serves the store bound to --master-addr only. When a
rank fails on one node, the ranks of every node are stopped, and every
node's launcher reports which node and rank failed first (the launchers
tell each other through the store).
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

from concord import _launching, _node_watch, _processes

_PROG = "concord-run"
# How long to wait for a stopped rank's output pipes to drain; a grandchild
# that escaped its process group may hold them open until it is killed.
_DRAIN_TIMEOUT_S = 2.0
# Signals to the launcher that stop the job.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How often the launcher looks for a signal while it waits for the ranks.
_POLL_S = 0.1
# What the launcher's watch of the other nodes puts among the ranks' exits:
# (_OTHER_NODE, record of the first failure).
_OTHER_NODE = -1
# How long the watch of the other nodes waits for node 0's store, unless
# --timeout says.
_WATCH_CONNECT_S = 600.0


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
                        help="port of torch.distributed's store, MASTER_PORT (default: a free "
                             "port on one node; required with --nnodes > 1)")
    parser.add_argument("--store-port", type=int, default=None,
                        help="port of concord's store, CONCORD_MASTER_PORT (default: a free port "
                             "on one node, --master-port + 1 with --nnodes > 1)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="timeout in seconds of every blocking wait in the ranks "
                             "(sets CONCORD_TIMEOUT)")
    parser.add_argument("--cpu-bind", choices=("none", "cores"), default="none",
                        help="cores: local rank k runs only on the k-th CPU this launcher may use "
                             "(modulo their number), as mpirun binds ranks to cores, so ranks "
                             "waiting for each other never share a CPU while another is idle "
                             "(default none: the scheduler places them)")
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
    for flag, port in (("--master-port", args.master_port), ("--store-port", args.store_port)):
        if port is not None and not 0 <= port <= 65535:
            parser.error(f"{flag} must be in [0, 65535]")
    if args.nnodes > 1:
        if args.master_port == 0 or args.store_port == 0:
            parser.error("--nnodes > 1 needs fixed ports, not 0")
        if args.store_port is None:
            if args.master_port == 65535:
                parser.error("--master-port 65535 leaves no --master-port + 1 for the store: "
                             "give --store-port")
            args.store_port = args.master_port + 1
        if args.store_port == args.master_port:
            parser.error("--store-port must differ from --master-port, which is torch's")
    if args.master_addr is None:
        args.master_addr = _launching.DEFAULT_MASTER_ADDR
    if args.store_port is None:
        args.store_port = 0
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
    """Copies one rank's stdout or stderr to ours, prefixed piece by piece.
    A bare carriage return (a progress bar redrawn at the start of a line)
    shows nothing, and takes no prefix: the text after it takes one."""
    out = getattr(stream, "buffer", None)
    with pipe:
        for piece in _segments(pipe):
            text = piece if piece == b"\r" else prefix + piece
            with lock:
                if out is not None:
                    out.write(text)
                else:
                    stream.write(text.decode(errors="replace"))
                stream.flush()
            if piece.endswith(b"\n"):
                tail.append(piece.decode(errors="replace"))


def _rank_cpus(cpu_bind: str, nprocs: int) -> list[set[int] | None]:
    """The CPUs each local rank may run on (None: wherever the launcher
    may)."""
    if cpu_bind == "none":
        return [None] * nprocs
    cpus = sorted(os.sched_getaffinity(0))
    return [{cpus[local_rank % len(cpus)]} for local_rank in range(nprocs)]


def _start_rank(rank: int, command: list[str], env: dict[str, str], exits: queue.Queue,
                lock: threading.Lock, cpus: set[int] | None) -> _Rank:
    launcher = os.getpid()

    def before_exec():
        # In the child before exec: system calls only. The rank dies with
        # this thread (the main one), however it ends.
        _processes.die_with_parent(launcher)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True,
                               preexec_fn=before_exec)
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


class _Supervisor:
    """Waits for the ranks, stops them when one fails (on this node or, on
    word from the watch, on another) or the launcher gets a signal, and
    says which came first."""

    def __init__(self, ranks: dict[int, _Rank], exits: queue.Queue):
        self.ranks = ranks
        self.exits = exits
        self.running: set[int] = set()
        self.failure: tuple[int, int, list[int]] | None = None
        # With several nodes: tells the others of this node's failure,
        # returning the record of the first failure of any node.
        self.publish = None
        self.first_record: str | None = None  # of any node, when there are several
        self.stopped_for_other_node: list[int] = []
        self.received: list[int] = []  # signals to the launcher, in order
        self._kill_at: float | None = None  # when the ranks still running get SIGKILL

    def signal_running(self, signum: int) -> None:
        for rank in self.running:
            self.ranks[rank].signal(signum)

    def on_signal(self, signum: int, _frame) -> None:
        """The launcher's handler of _STOP_SIGNALS: passes the signal on (a
        second Ctrl-C as SIGKILL) and has the ranks stopped."""
        self.received.append(signum)
        if signum == signal.SIGINT and self.received.count(signal.SIGINT) > 1:
            signum = signal.SIGKILL
        self.signal_running(signum)
        if self._kill_at is None:
            self._kill_at = time.monotonic() + _launching.STOP_GRACE_S

    def stop(self) -> None:
        """SIGTERM to every running rank; SIGKILL after the grace period."""
        self.signal_running(signal.SIGTERM)
        if self._kill_at is None:
            self._kill_at = time.monotonic() + _launching.STOP_GRACE_S

    def run(self) -> None:
        """Returns once every rank has exited."""
        while self.running:
            if self._kill_at is not None and time.monotonic() >= self._kill_at:
                self.signal_running(signal.SIGKILL)
            try:
                rank, code = self.exits.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if rank == _OTHER_NODE:
                if self.failure is None and self.first_record is None and not self.received:
                    self.first_record = code
                    self.stopped_for_other_node = sorted(self.running)
                    self.stop()
                continue
            self.running.discard(rank)
            if code != 0 and self.failure is None and self.first_record is None \
                    and not self.received:
                self.failure = rank, code, sorted(self.running)
                self.stop()
                if self.publish is not None:
                    self.first_record = self.publish(rank, _launching.describe_exit(code))


def _drain(ranks: dict[int, _Rank]) -> None:
    """Waits until the ranks' remaining output has been copied."""
    deadline = time.monotonic() + _DRAIN_TIMEOUT_S
    for started in ranks.values():
        for reader in started.readers:
            reader.join(max(0.0, deadline - time.monotonic()))


def _named(report: str) -> str:
    # Output lines are indented; the report's own lines carry our name.
    return "\n".join(line if line.startswith(" ") else f"{_PROG}: {line}"
                     for line in report.splitlines())


def _report(ranks: dict[int, _Rank], failure: tuple[int, int, list[int]],
            first_record: str | None, node: int) -> str:
    rank, code, stopped = failure
    cause = _launching.describe_exit(code)
    heading = None
    if first_record is not None:  # several nodes
        heading = _node_watch.heading(first_record)
        if first_record != _node_watch.record(node, rank, cause):
            heading += f"; then rank {rank} of node {node} failed ({cause})"
    return _named(_launching.failure_report(
        rank, cause, stopped, f"last lines of rank {rank}", list(ranks[rank].tail),
        heading=heading))


def _other_node_report(first_record: str, node: int, stopped: list[int]) -> str:
    return _named(f"{_node_watch.heading(first_record)}\n"
                  f"stopped the ranks of node {node}: {', '.join(map(str, stopped)) or '(none)'}")


def _signal_report(signum: int, ranks: dict[int, _Rank]) -> str:
    codes = ", ".join(f"rank {rank}: {_launching.describe_exit(started.process.returncode)}"
                      for rank, started in sorted(ranks.items()))
    return f"{_PROG} received {signal.Signals(signum).name}; stopped the ranks ({codes})"


def _run(args: argparse.Namespace) -> int:
    world_size = args.nnodes * args.nprocs
    token = _launching.job_token()
    # What the ranks leave behind becomes ours to kill when the job ends.
    _processes.become_subreaper()
    server = None
    if args.node_rank == 0:
        try:
            server = _launching.serve_store(args.master_addr, args.store_port, token)
        except RuntimeError as exc:
            print(f"{_PROG}: cannot serve the rendezvous store on "
                  f"{args.master_addr}:{args.store_port}: {exc}", file=sys.stderr)
            return 1
    store_port = server.port if server is not None else args.store_port
    master_port = args.master_port
    if master_port is None:  # one node: a free port for torch's store
        master_port = _launching.free_port(args.master_addr)
    command = _rank_command(args.target, args.module)
    rank_cpus = _rank_cpus(args.cpu_bind, args.nprocs)
    ranks: dict[int, _Rank] = {}
    exits: queue.Queue = queue.Queue()
    lock = threading.Lock()
    supervisor = _Supervisor(ranks, exits)
    watch = None
    if args.nnodes > 1:
        watch = _node_watch.NodeWatch(
            args.master_addr, store_port, token, args.node_rank,
            args.timeout if args.timeout is not None else _WATCH_CONNECT_S,
            lambda record: exits.put((_OTHER_NODE, record)))
        supervisor.publish = watch.publish
    previous_handlers = {signum: signal.signal(signum, supervisor.on_signal)
                         for signum in _STOP_SIGNALS}
    try:
        for local_rank in range(args.nprocs):
            if supervisor.received:
                break
            rank = args.node_rank * args.nprocs + local_rank
            env = dict(os.environ)
            env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach us as they are printed
            _launching.apply_rank_environment(env, _launching.rank_environment(
                rank=rank, local_rank=local_rank, world_size=world_size,
                local_world_size=args.nprocs, master_addr=args.master_addr,
                master_port=master_port, store_port=store_port, token=token,
                timeout_s=args.timeout))
            ranks[rank] = _start_rank(rank, command, env, exits, lock, rank_cpus[local_rank])
            supervisor.running.add(rank)
        supervisor.run()
    except BaseException:
        supervisor.stop()
        supervisor.run()
        raise
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
        if watch is not None:
            watch.stop()
        if server is not None:
            server.close()
        # The ranks are reaped: any child left is something they started.
        _processes.kill_children()
    _drain(ranks)
    if supervisor.failure is not None:  # a rank failed before any signal came
        report = _report(ranks, supervisor.failure, supervisor.first_record, args.node_rank)
        code = supervisor.failure[1]
        code = code if code > 0 else 1
    elif supervisor.first_record is not None:  # a rank of another node did
        report, code = _other_node_report(supervisor.first_record, args.node_rank,
                                          supervisor.stopped_for_other_node), 1
    elif supervisor.received:
        signum = supervisor.received[0]
        report, code = _signal_report(signum, ranks), 128 + signum
    else:
        return 0
    with lock:
        sys.stdout.flush()
        print(report, file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    return _run(_parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
