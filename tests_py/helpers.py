"""What several test modules, and the ranks they start, share: each rank's
random data, the NumPy references of the collectives and the comparison
of results with them, a collector of the failures of one rank's checks,
host copies of torch tensors, a GPU delay, the install locations
`python -m concord` reports, the end of processes that lead sessions of
their own, and ranks run as processes of a job served by the test.

conftest.py puts this directory on sys.path (the suite imports test
modules by path), so test modules import it by name; the fixtures
(seeds, worlds, ranks) are in conftest.py.
"""

import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

OPS = ("sum", "mean", "max", "min", "prod")
FLOATS = ("float16", "bfloat16", "float32", "float64")
# About 10 ms of GPU time at H200 clocks: long enough that work not ordered
# after a stream's pending work would run before it.
SLEEP_CYCLES = 20_000_000


def ops_for(dtype):
    """The reduce ops a dtype supports (bool: max and min only)."""
    return ["max", "min"] if dtype == "bool" else list(OPS)


def rank_data(seed, rank, case, dtype, shape, op="sum"):
    """One rank's NumPy data for one case, in ranges where no reference
    overflows; bfloat16 data is float32 values (rounded when converted)."""
    rng = np.random.default_rng([seed, rank, case])
    kind = "f" if dtype in FLOATS else np.dtype(dtype).kind
    if kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if kind == "f":
        low, high = (0.5, 1.5) if op == "prod" else (-2.0, 2.0)
        return rng.uniform(low, high, shape).astype("float32" if dtype == "bfloat16" else dtype)
    if kind == "u":
        return rng.integers(0, 3 if op == "prod" else 40, shape, dtype=dtype)
    low, high = (-2, 3) if op == "prod" else (-20, 21)
    return rng.integers(low, high, shape, dtype=dtype)


def wide_reference(arrays, op, dtype):
    """`op` over every rank's NumPy data of `dtype` as concord defines it:
    16-bit floats accumulate in float32, integer means truncate toward zero.
    The result is in the accumulation dtype (float32 for 16-bit floats,
    int64 for integer sums, products and means), for the caller to round
    to `dtype`."""
    stack = np.stack(arrays)
    if op in ("max", "min"):
        return getattr(stack, op)(axis=0)
    if dtype in FLOATS:
        acc = stack.astype(np.float64 if dtype == "float64" else np.float32)
        if op == "prod":
            return acc.prod(axis=0)
        total = acc.sum(axis=0)
        return total / acc.dtype.type(len(arrays)) if op == "mean" else total
    if op == "mean":
        return np.trunc(stack.astype(np.float64).sum(axis=0) / len(arrays)).astype(np.int64)
    wide = stack.astype(np.int64)
    return wide.prod(axis=0) if op == "prod" else wide.sum(axis=0)


def reference_reduce(arrays, op):
    """op over the NumPy arrays as concord defines it, in their dtype."""
    dtype = arrays[0].dtype
    return wide_reference(arrays, op, dtype.name).astype(dtype)


def array_difference(result, expected, tolerance):
    """What is wrong with the NumPy array `result` against `expected` (its
    dtype, its shape, then its values: floats within tolerance[dtype name]
    = (rtol, atol), others exactly), or None."""
    if result.dtype != expected.dtype or result.shape != expected.shape:
        return (f"result is {result.dtype}{list(result.shape)}, "
                f"expected {expected.dtype}{list(expected.shape)}")
    if expected.dtype.name in tolerance:
        rtol, atol = tolerance[expected.dtype.name]
        equal = np.isclose(result.astype(np.float64), expected.astype(np.float64), rtol, atol)
    else:
        equal = result == expected
    if equal.all():
        return None
    first = np.unravel_index(np.argmin(equal), equal.shape)
    return (f"{np.count_nonzero(~equal)} elements differ, first at {tuple(map(int, first))}: "
            f"{result[first]!r} != {expected[first]!r}")


class RankChecks:
    """The checks of one rank; failures are collected, not raised, so one
    run reports all of them (and every rank keeps issuing the same
    collectives). Subclasses say what is wrong with a result in
    difference(result, expected)."""

    def __init__(self, seed, rank, size):
        self.seed = seed
        self.rank = rank
        self.size = size
        self.case = 0
        self.failures = []

    def difference(self, result, expected):
        raise NotImplementedError

    def fail(self, label, problem):
        self.failures.append(f"rank {self.rank} case {self.case} {label}: {problem}")

    def expect(self, label, result, expected):
        problem = self.difference(result, expected)
        if problem is not None:
            self.fail(label, problem)

    def expect_true(self, label, condition):
        if not condition:
            self.fail(label, "check failed")


def report(failures, seed):
    """An assertion message: how many checks failed, the first of them, and
    the seed that reproduces them."""
    shown = "\n".join(failures[:40])
    return f"seed {seed}: {len(failures)} checks failed\n{shown}"


def host(x):
    """A result as NumPy: torch tensors copied back (on the current stream),
    bfloat16 widened to float32 (exactly)."""
    if hasattr(x, "detach"):
        x = x.detach()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.cpu().numpy()
    return np.asarray(x)


def delay(torch):
    """Queues a sleep kernel on the current stream (when torch has one)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(SLEEP_CYCLES)


def concord_main(flag):
    """What `python -m concord <flag>` prints: an install location, or the version."""
    return subprocess.run([sys.executable, "-m", "concord", flag], capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()


def load_module(path, name):
    """The module at `path`, imported under `name` (test modules are files,
    not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def finish_sessions(processes, timeout):
    """(returncode, stdout, stderr) of each process, every one leading a
    session of its own (started with start_new_session), waited for until
    `timeout` seconds from now; one still running then is killed, and its
    returncode is None. Every session is killed at the end, also when the
    wait fails, so that nothing a process started outlives the test."""
    deadline = time.monotonic() + timeout
    results = []
    try:
        for process in processes:
            try:
                stdout, stderr = process.communicate(
                    timeout=max(0.1, deadline - time.monotonic()))
                results.append((process.returncode, stdout, stderr))
            except subprocess.TimeoutExpired:
                _kill_session(process)
                stdout, stderr = process.communicate()
                results.append((None, stdout, stderr))
    finally:
        for process in processes:
            _kill_session(process)
            process.communicate()
    return results


def _kill_session(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---- ranks as processes of a job served here -------------------------------------

def json_events(stdout):
    """The JSON objects a rank printed, one a line (other lines skipped)."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


class RankProcesses:
    """`nranks` fresh processes running `script args...` as the ranks of one
    job that meets at a store served by this process (as concord-run's
    ranks do). As a context manager it kills, on exit, every rank still
    running and removes any shared-memory segment their communicators left
    (none should be: `leftover_segments` says which were)."""

    def __init__(self, script, nranks, *args, env=None, cwd=None):
        self.script = str(script)
        self.nranks = nranks
        self.args = [str(a) for a in args]
        self.env = env or {}
        self.cwd = cwd
        self.processes = []
        self.leftover_segments = []
        self._server = None

    def __enter__(self):
        from concord import _capi
        token = secrets.token_hex(16)
        self._server = _capi.StoreServer("127.0.0.1", 0, token)
        for rank in range(self.nranks):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(self.nranks), LOCAL_WORLD_SIZE=str(self.nranks),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self._server.port),
                       CONCORD_JOB_TOKEN=token, CONCORD_STORE_SERVER="launcher", **self.env)
            self.processes.append(subprocess.Popen(
                [sys.executable, self.script, *self.args], env=env, cwd=self.cwd,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, errors="replace"))
        return self

    def finish(self, timeout):
        """[(returncode, stdout, stderr)] per rank once all exited; a rank
        still running after `timeout` seconds (all together) is killed and
        reported with returncode None."""
        deadline = time.monotonic() + timeout
        results = []
        for process in self.processes:
            try:
                stdout, stderr = process.communicate(
                    timeout=max(0.1, deadline - time.monotonic()))
                results.append((process.returncode, stdout, stderr))
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
                results.append((None, stdout, stderr))
        return results

    def __exit__(self, *exc_info):
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.communicate()
        self._server.close()
        for process in self.processes:
            for segment in Path("/dev/shm").glob(f"concord-{process.pid}-*"):
                self.leftover_segments.append(segment.name)
                segment.unlink(missing_ok=True)
