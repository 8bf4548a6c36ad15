"""Helpers shared by the bench/ scripts: timing loops, nccl-tests bandwidth
formulas, running worker jobs and printing tables.

A collective's time per iteration is the slowest rank's (ranks time every
iteration themselves, then reduce the times with MAX); a measurement is the
median of those over the timed iterations.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

GB = 1e9

# nccl-tests' busbw factors: the fraction of the data each rank must send
# over its link, so busbw is comparable with the hardware's bandwidth
# whatever the number of ranks.
_BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}

Barrier = Callable[[], None]
# Returns the element-wise maximum of a float64 array over all ranks.
MaxOverRanks = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Budget:
    """How long to time one measurement: iterations adapt to the message
    size so small messages get many samples and large ones stay affordable."""

    seconds: float
    min_iters: int
    max_iters: int
    max_warmup: int = 200
    warmup_fraction: float = 0.2


def algbw(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GB


def bus_factor(op: str, world_size: int) -> float:
    return _BUS_FACTORS[op](world_size)


def busbw(op: str, nbytes: int, seconds: float, world_size: int) -> float:
    return algbw(nbytes, seconds) * bus_factor(op, world_size)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _loop_seconds(fn: Callable[[], object], iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return time.perf_counter() - start


def timed_loop(fn: Callable[[], object], iters: int, barrier: Barrier,
               max_over_ranks: MaxOverRanks) -> np.ndarray:
    """Per-iteration times of the slowest rank. The barrier lines the ranks
    up so the first iteration does not include another rank's lateness."""
    times = np.empty(iters, dtype=np.float64)
    clock = time.perf_counter
    barrier()
    for i in range(iters):
        start = clock()
        fn()
        times[i] = clock() - start
    return max_over_ranks(times)


def measure(fn: Callable[[], object], budget: Budget, barrier: Barrier,
            max_over_ranks: MaxOverRanks) -> np.ndarray:
    """Warms up, then times as many iterations as fit in the budget. Every
    rank must run the same number of iterations, so the estimates that pick
    the counts are the slowest rank's. The estimate is the warm-up's median:
    a slow first call (buffers being set up) must not cut the sample."""
    barrier()
    first = max_over_ranks(np.array([_loop_seconds(fn, 1)]))[0]
    warmup = _clamp(int(budget.warmup_fraction * budget.seconds / first), 2, budget.max_warmup)
    per_iter = float(np.median(timed_loop(fn, warmup, barrier, max_over_ranks)))
    iters = _clamp(int(budget.seconds / per_iter), budget.min_iters, budget.max_iters)
    return timed_loop(fn, iters, barrier, max_over_ranks)


def interleaved(fns: list, budget: Budget, barrier: Barrier,
                max_over_ranks: MaxOverRanks) -> list[float]:
    """The median time of each of `fns` (the slowest rank's), timed in
    rounds that run each once, so that a load changing on a shared machine
    weighs on all of them alike."""
    for fn in fns:  # the first calls set buffers up (DDP's buckets, say)
        fn()
        fn()

    def one_round() -> np.ndarray:
        times = np.empty(len(fns))
        for j, fn in enumerate(fns):
            barrier()
            start = time.perf_counter()
            fn()
            times[j] = time.perf_counter() - start
        return times

    round_s = float(max_over_ranks(one_round()).sum())
    rounds = min(max(int(budget.seconds / round_s), budget.min_iters), budget.max_iters)
    times = np.stack([one_round() for _ in range(rounds)])
    times = max_over_ranks(times.reshape(-1)).reshape(times.shape)
    return [float(t) for t in np.median(times, axis=0)]


def memcpy_bandwidth(nbytes: int, reps: int) -> float:
    """Median GB/s of one thread copying nbytes between preallocated arrays
    (bytes copied per second, not read + written)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # maps the destination's pages before timing
    times = [_loop_seconds(lambda: np.copyto(dst, src), 1) for _ in range(reps)]
    return algbw(nbytes, statistics.median(times))


def concurrent_memcpy_bandwidth(nbytes: int, reps: int, threads: int) -> float:
    """Median GB/s copied by `threads` threads at once, each between its own
    preallocated arrays of nbytes (NumPy releases the GIL while it copies):
    what several ranks copying together get from the memory system."""
    import concurrent.futures

    pairs = [(np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8))
             for _ in range(threads)]
    for src, dst in pairs:
        np.copyto(dst, src)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        def once() -> float:
            start = time.perf_counter()
            list(pool.map(lambda pair: np.copyto(pair[1], pair[0]), pairs))
            return time.perf_counter() - start
        times = [once() for _ in range(reps)]
    return algbw(nbytes * threads, statistics.median(times))


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on host; another process could take it before use,
    which is acceptable for a benchmark on a quiet machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def write_json(path: str, data: object) -> None:
    """Replaces path atomically, so a reader never sees half a file even if
    the writer dies."""
    directory = os.path.dirname(path) or "."
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp") as tmp:
        json.dump(data, tmp)
    os.replace(tmp.name, path)


def read_json(path: str) -> object | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@dataclass
class JobOutcome:
    returncode: int | None  # None: stopped after the timeout
    seconds: float
    output: str

    def failure(self, tail_lines: int = 6) -> str | None:
        """Why the job failed, with its last lines of output; None if it
        succeeded."""
        if self.returncode == 0:
            return None
        how = (f"timed out after {self.seconds:.0f} s" if self.returncode is None
               else f"exited with status {self.returncode}")
        tail = [line.strip() for line in self.output.strip().splitlines()[-tail_lines:]]
        return how + ("; last output: " + " | ".join(tail) if tail else "")


def run_job(command: Sequence[str], env: dict[str, str], timeout_s: float) -> JobOutcome:
    """Runs a launcher (concord-run, mpirun) and returns its exit status and
    output. The launcher leads its own process group so it can be stopped
    with everything it started: on timeout, or when we are interrupted (Ctrl-C
    no longer reaches it). It gets SIGTERM first: launchers forward it to
    their ranks."""
    start = time.monotonic()
    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace",
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return JobOutcome(None, time.monotonic() - start, _stop_group(process))
    except BaseException:
        _stop_group(process)
        raise
    return JobOutcome(process.returncode, time.monotonic() - start, output)


def _stop_group(process: subprocess.Popen, grace_s: float = 10.0) -> str:
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            break
        try:
            output, _ = process.communicate(timeout=grace_s)
            return output
        except subprocess.TimeoutExpired:
            continue
    output, _ = process.communicate()
    return output


def parse_bytes(text: str) -> int:
    """A size given as 8, 64K, 4MiB, 1G, ..."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def format_bytes(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Right-aligned columns, each as wide as its widest cell."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = ["  ".join(str(cell).rjust(width) for cell, width in zip(line, widths))
             for line in (headers, *rows)]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
