"""Load test of concord's rendezvous store on loopback: up to 1,024 ranks
meeting at once, against the number of ranks.

One store server (concord's, in this process) and one client process
(bench/store_load.c, compiled here against the installed library) whose
threads are the ranks. Each rank connects with the job token and makes the
store calls a rank's init makes, through concord's C API, all released at
once:

- every communicator (comm/world.cpp, comm/hosts.cpp): add its generation,
  set its host identity, get every other rank's (one get each);
- pattern "shm", ranks of one host (comm/shm/shm_backend.cpp): rank 0 sets
  the segment's name, the others get it; every rank counts itself in (add),
  the last sets the done key, all wait for it and read the count again;
- pattern "gloo", one rank a host (Gloo's connectFullMesh through
  comm/gloo/store_adapter.cpp, then comm/gloo/setup_agreement.cpp): set its
  host name, wait for and get those of the ranks before it; set the
  addresses of its n-1 pairs in one value (136 bytes each); wait for and
  get every peer's whole value; count in; waits go in 50 ms slices.

Reports, per pattern and number of ranks, over the repeats: the time from
the release to the last rank done (median, max), the median rank's time,
the slowest connect, the bytes the ranks read from the store, the most
descriptors the server's process held, and the kernel's listen-queue
overflows during the run (SYNs or handshakes the full accept queue
dropped; each costs a client at least one second of retransmission).

    python3 bench/store_load.py                      # 16, 64, 256, 1024 ranks
    python3 bench/store_load.py --ranks 1024 --repeats 5 --patterns shm

A benchmark, not a test: it asserts nothing. Every run is bounded by
--timeout, every client count by --max-ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAX_RANKS = 1024
# Gloo's pair address (sockaddr_storage and a sequence number).
GLOO_ADDRESS_BYTES = 136


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="16,64,256,1024",
                        help=f"comma-separated numbers of ranks (at most {MAX_RANKS})")
    parser.add_argument("--patterns", default="shm,gloo", help="shm, gloo or both")
    parser.add_argument("--gloo-max-ranks", type=int, default=256,
                        help="largest world for the gloo pattern, whose ranks read "
                             "(n-1)^2 * 136 bytes each")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one run may take (the ranks' store timeout too)")
    args = parser.parse_args(argv)
    args.ranks = [int(n) for n in args.ranks.split(",")]
    if any(n < 1 or n > MAX_RANKS for n in args.ranks):
        parser.error(f"--ranks must be between 1 and {MAX_RANKS}")
    args.patterns = args.patterns.split(",")
    if any(p not in ("shm", "gloo") for p in args.patterns):
        parser.error("--patterns takes shm and gloo")
    return args


def concord_path(what: str) -> str:
    result = subprocess.run([sys.executable, "-m", "concord", what], check=True,
                            capture_output=True, text=True)
    return result.stdout.strip()


def compile_driver(workdir: str) -> str:
    compiler = shutil.which("cc")
    if compiler is None:
        raise SystemExit("store_load: needs a C compiler (cc)")
    libdir, includedir = concord_path("--libdir"), concord_path("--includedir")
    output = os.path.join(workdir, "store_load")
    subprocess.run([compiler, "-O2", "-std=c11", "-pthread", f"-I{includedir}",
                    "-o", output, str(HERE / "store_load.c"), f"-L{libdir}",
                    f"-Wl,-rpath,{libdir}", "-lconcord"], check=True)
    return output


def listen_drops() -> dict[str, int]:
    """The kernel's ListenOverflows and ListenDrops (TcpExt, /proc/net/netstat)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], map(int, values.split()[1:])))
            return {k: table.get(k, 0) for k in ("ListenOverflows", "ListenDrops")}
    return {"ListenOverflows": 0, "ListenDrops": 0}


class FdWatch:
    """The most descriptors this process (the store's) held while it ran."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, len(os.listdir("/proc/self/fd")))
            self._stop.wait(0.02)

    def __enter__(self) -> FdWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


def one_run(driver: str, pattern: str, ranks: int, timeout: float) -> dict:
    from concord import _capi

    token = secrets.token_hex(16)
    server = _capi.StoreServer("127.0.0.1", 0, token)
    before = listen_drops()
    try:
        with FdWatch() as fds:
            command = [driver, "127.0.0.1", str(server.port), token, str(ranks), pattern,
                       "world", str(timeout)]
            try:
                done = subprocess.run(command, capture_output=True, text=True,
                                      timeout=timeout + 30)
            except subprocess.TimeoutExpired:
                return {"errors": ranks, "first_error": f"no result within {timeout + 30:.0f} s"}
    finally:
        server.close()
    after = listen_drops()
    if done.returncode != 0:
        return {"errors": ranks, "first_error": done.stderr.strip()[-300:]}
    result = json.loads(done.stdout)
    result["server_fds"] = fds.peak
    result.update({k: after[k] - before[k] for k in after})
    return result


def store_requests(pattern: str, n: int) -> int:
    """Requests the ranks send at least (a sliced wait that runs out is sent again)."""
    # each rank: hello, add; the others: set, get the list; rank 0: n-1 gets, set
    hosts = 2 * n + 2 * (n - 1) + n
    count_in = 3 * n + 1  # each rank: add, wait, add; the last one in: set
    if pattern == "shm":
        return hosts + n + count_in  # rank 0 sets the segment, the others get it
    # each rank: set its name, set its addresses, three requests a peer for
    # them; rank r waits for and gets the names of the r ranks before it
    mesh = n * (2 + 3 * (n - 1)) + n * (n - 1)
    return hosts + mesh + count_in


def table(rows: list[dict]) -> None:
    header = ("pattern", "ranks", "all done med s", "all done max s", "rank med s",
              "slowest connect s", "requests (min)", "MB read", "server fds", "listen drops", "errors")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for row in rows:
        print(" | ".join(str(row[k]) for k in header))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"# store load test: {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; descriptors {soft} (hard {hard}); "
          f"somaxconn {Path('/proc/sys/net/core/somaxconn').read_text().strip()}, "
          f"tcp_max_syn_backlog {Path('/proc/sys/net/ipv4/tcp_max_syn_backlog').read_text().strip()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="store_load_") as workdir:
        driver = compile_driver(workdir)
        for pattern in args.patterns:
            for n in args.ranks:
                if pattern == "gloo" and n > args.gloo_max_ranks:
                    print(f"# gloo pattern, {n} ranks: skipped (each rank would read "
                          f"{(n - 1) ** 2 * GLOO_ADDRESS_BYTES / 1e6:.0f} MB; "
                          f"--gloo-max-ranks {args.gloo_max_ranks})")
                    continue
                runs = [one_run(driver, pattern, n, args.timeout) for _ in range(args.repeats)]
                good = [r for r in runs if r.get("errors") == 0]
                failures = [r["first_error"] for r in runs if r.get("errors")]
                for failure in failures[:1]:
                    print(f"# {pattern}, {n} ranks: {failure}")
                done = [r["all_done_s"] for r in good]
                rows.append({
                    "pattern": pattern, "ranks": n,
                    "all done med s": f"{statistics.median(done):.3f}" if done else "-",
                    "all done max s": f"{max(done):.3f}" if done else "-",
                    "rank med s": (f"{statistics.median(r['median_done_s'] for r in good):.3f}"
                                   if good else "-"),
                    "slowest connect s": (f"{max(r['slowest_connect_s'] for r in good):.3f}"
                                          if good else "-"),
                    "requests (min)": store_requests(pattern, n),
                    "MB read": f"{good[0]['bytes_read'] / 1e6:.1f}" if good else "-",
                    "server fds": max((r.get("server_fds", 0) for r in runs), default=0),
                    "listen drops": sum(r.get("ListenDrops", 0) for r in runs),
                    "errors": f"{len(failures)}/{len(runs)} runs",
                })
                print(f"# {pattern}, {n} ranks: {[round(x, 3) for x in done]}", flush=True)
    table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
