"""Test hosts on one machine: network namespaces joined by a bridge.

    with TestHosts(2) as hosts:
        hosts.popen(1, ["python", "job.py"])      # runs on node1
        hosts.address(0)                          # node0's address

Each host is a network namespace with one interface, eth0, on a private
subnet used only inside the namespaces made here; the bridge joining them
lives in a namespace of its own, so the machine's own network is never
touched. A process started on a host also gets a UTS namespace with the
host's name and a mount namespace with a fresh tmpfs on /dev/shm and an
/etc/hosts naming every test host: to concord each is another machine.

Every namespace holds the id of the process that made it, and whatever
ran in it is killed when the hosts are closed (at the latest when that
process exits); namespaces left behind by a process that was killed
outright are removed by the next run. Needs root, `ip` and `unshare`;
`unavailable()` says why namespaces cannot be made here, if they cannot.

bench/multihost.py imports this file too.
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["TestHosts", "unavailable", "leftover_namespaces", "namespaces"]

PREFIX = "ccnet"
SUBNET = "10.77.0"  # host k is SUBNET.(k + 1)/24
INTERFACE = "eth0"
# Namespaces of this module: PREFIX-<pid of the maker>-<run>-<role>.
_NAME = re.compile(rf"^{PREFIX}-(\d+)-[0-9a-f]+-(?:sw|h\d+)$")
_IP_TIMEOUT_S = 30
# Rounds of SIGKILL for the processes of a namespace being removed (each
# round also reaps those that were forking).
_KILL_ROUNDS = 50

# Runs argv on the host: its name, a tmpfs on /dev/shm, its /etc/hosts.
_ENTER_HOST = ('set -e; hostname "$1"; mount -t tmpfs concord-test-shm /dev/shm; '
               'mount --bind "$2" /etc/hosts; shift 2; exec "$@"')


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S,
                          check=check)


def namespaces() -> list[str]:
    """Every network namespace `ip netns` knows."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.strip()]


def _kill_and_delete(namespace: str) -> None:
    """SIGKILLs every process in the namespace, then deletes it."""
    for _ in range(_KILL_ROUNDS):
        pids = [int(p) for p in _ip("netns", "pids", namespace, check=False).stdout.split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    _ip("netns", "delete", namespace, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftover_namespaces() -> list[str]:
    """Namespaces of this module whose maker is gone (it was killed
    before it could remove them)."""
    return [name for name in namespaces()
            if (match := _NAME.match(name)) and not _alive(int(match.group(1)))]


def unavailable() -> str | None:
    """Why test hosts cannot be made on this machine, or None."""
    for program in ("ip", "unshare", "hostname", "mount"):
        if shutil.which(program) is None:
            return f"network namespaces need `{program}`, which is not installed"
    probe = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(4)}-sw"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        entered = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--uts", "--mount",
                                  "sh", "-c", "hostname probe && mount -t tmpfs t /dev/shm"],
                                 capture_output=True, text=True, timeout=_IP_TIMEOUT_S)
        if entered.returncode != 0:
            return (f"cannot give a namespace its own host name and /dev/shm: "
                    f"{entered.stderr.strip()}")
    finally:
        _kill_and_delete(probe)
    return None


class TestHosts:
    """`count` test hosts, node0 ... node<count-1>, made on entry and
    removed, with every process started on them, on exit."""

    __test__ = False  # not a test class, whatever pytest makes of its name

    def __init__(self, count: int):
        if count < 1:
            raise ValueError("count must be at least 1")
        self.count = count
        self.run_id = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{self.run_id}-sw"
        self.namespaces = [f"{self.run_id}-h{k}" for k in range(count)]
        self.names = [f"node{k}" for k in range(count)]
        self.processes: list[subprocess.Popen] = []
        self._dir: tempfile.TemporaryDirectory | None = None
        self._made: list[str] = []

    def address(self, k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    def __enter__(self) -> TestHosts:
        for name in leftover_namespaces():
            _kill_and_delete(name)
        atexit.register(self.close)
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _make(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix=f"{self.run_id}-")
        lines = ["127.0.0.1 localhost"]
        lines += [f"{self.address(k)} {self.names[k]}" for k in range(self.count)]
        self.hosts_file = Path(self._dir.name) / "hosts"
        self.hosts_file.write_text("\n".join(lines) + "\n")
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for k, namespace in enumerate(self.namespaces):
            self._add_namespace(namespace)
            # Both ends are made in their namespaces: no name in the
            # machine's own namespace, so parallel runs cannot collide.
            _ip("link", "add", INTERFACE, "netns", namespace, "type", "veth",
                "peer", "name", f"port{k}", "netns", self.switch)
            _ip("-n", self.switch, "link", "set", f"port{k}", "master", "br0", "up")
            _ip("-n", namespace, "addr", "add", f"{self.address(k)}/24", "dev", INTERFACE)
            _ip("-n", namespace, "link", "set", INTERFACE, "up")

    def shape(self, k: int, qdisc: list[str]) -> subprocess.CompletedProcess:
        """Sets the root queueing discipline of host k's interface (tc's
        words after `root`, for example netem delay 50us rate 10gbit)."""
        return subprocess.run(["ip", "netns", "exec", self.namespaces[k], "tc", "qdisc",
                               "replace", "dev", INTERFACE, "root", *qdisc],
                              capture_output=True, text=True, timeout=_IP_TIMEOUT_S)

    def command(self, k: int, argv: list[str]) -> list[str]:
        """argv as run on host k."""
        return ["ip", "netns", "exec", self.namespaces[k], "unshare", "--uts", "--mount",
                "sh", "-c", _ENTER_HOST, "sh", self.names[k], str(self.hosts_file),
                *map(str, argv)]

    def remote_shell(self) -> str:
        """An executable to use in place of ssh (mpirun's plm_rsh_agent):
        `remote_shell HOST COMMAND...` runs COMMAND, a shell command line as
        ssh would take it, on the test host named HOST."""
        lines = ["#!/bin/sh", "host=$1; shift", 'case "$host" in']
        for k, name in enumerate(self.names):
            lines.append(f'  {name}) exec {shlex.join(self.command(k, ["sh", "-c"]))} "$*" ;;')
        lines += ['  *) echo "no test host $host" >&2; exit 1 ;;', "esac"]
        path = Path(self._dir.name) / "remote_shell"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o755)
        return str(path)

    def popen(self, k: int, argv: list[str], **kwargs) -> subprocess.Popen:
        """Starts argv on host k, in a session of its own; it is killed
        when the hosts are closed, if it has not exited by then."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        process = subprocess.Popen(self.command(k, argv), start_new_session=True, **kwargs)
        self.processes.append(process)
        return process

    def run(self, k: int, argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
        """Runs argv on host k to its end (killed after `timeout` seconds)."""
        process = self.popen(k, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             errors="replace", **kwargs)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def tx_bytes(self, k: int) -> int:
        """Bytes host k has sent over its interface so far."""
        shown = _ip("-n", self.namespaces[k], "-s", "-o", "link", "show", INTERFACE).stdout
        # "... TX: bytes packets ... \    <bytes> <packets> ..."
        return int(shown.split("TX:")[1].split("\\")[1].split()[0])

    def close(self) -> None:
        """Kills what runs on the hosts and removes every namespace made
        (the links go with them). Safe to call more than once."""
        atexit.unregister(self.close)
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for name in reversed(self._made):
            _kill_and_delete(name)
        self._made.clear()
        for process in self.processes:
            try:
                process.communicate(timeout=_IP_TIMEOUT_S)
            except (subprocess.TimeoutExpired, ValueError):
                pass
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
