"""CPU collectives: concord against torch.distributed (gloo) and Open MPI
(mpi4py), all started by this script in the same run.

    python3 bench/allreduce_cpu.py                # 8 B .. 256 MiB, 2 and 4 ranks
    python3 bench/allreduce_cpu.py --quick        # a few sizes, about a minute
    python3 bench/allreduce_cpu.py --sizes 8,64K,64M --nprocs 2 --libs concord,mpi

For every (operation, world size) it prints the median time of the slowest
rank, algbw and busbw (nccl-tests formulas) per library, the time ratio of
each peer to concord, and for large sizes the time the machine's memory
bandwidth allows and concord's fraction of it. Then the memcpy bandwidths,
the 8-byte all_reduce latency and the performance targets with pass/fail,
and (with matplotlib) a plot of algbw against size.

The same file is the worker each launcher starts (--worker LIB); rank 0
writes its results as JSON after every measurement, so a crash still leaves
what was measured before it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import numpy as np

import _timing
from _timing import Budget

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
LIBS = ("concord", "gloo", "mpi")
LABELS = {"concord": "concord", "gloo": "torch gloo", "mpi": "Open MPI"}
SHORT = {"concord": "cc", "gloo": "gloo", "mpi": "mpi"}
DTYPE = np.float32
ITEMSIZE = np.dtype(DTYPE).itemsize

MEMCPY_BYTES = 256 << 20
LATENCY_BYTES = 8
LATENCY_ITERS = 10_000
LATENCY_WARMUP = 1_000
TARGET_BYTES = 64 << 20
TARGET_WORLD = 2
TARGET_GLOO_RATIO = 3.0
TARGET_MPI_RATIO = 1.0
TARGET_LATENCY_US = 20.0
TARGET_BOUND_FRACTION = 0.7
# Sizes from which the memory-bound column is shown (below, latency rules).
BOUND_FROM_BYTES = 1 << 20
BOUND_COPY_BYTES = 64 << 20
# Bound on every blocking wait inside a worker, so a rank stuck in a broken
# collective fails with an error instead of holding the run.
COLLECTIVE_TIMEOUT_S = 300


@dataclass(frozen=True)
class Mode:
    max_bytes: int
    size_factor: int
    budget: Budget
    memcpy_reps: int
    job_timeout_s: float


# On 2 cores the full range takes 3 to 6 minutes (more with other work
# running), --quick under one.
FULL = Mode(256 << 20, 4, Budget(seconds=0.6, min_iters=5, max_iters=2000), 10, 1500.0)
QUICK = Mode(64 << 20, 16, Budget(seconds=0.08, min_iters=3, max_iters=300), 5, 300.0)


def element_count(op: str, nbytes: int, world_size: int) -> int:
    """float32 elements of the size's buffer (all_reduce, broadcast: each
    rank's buffer; all_gather: the full output; reduce_scatter: the full
    input), rounded down to a multiple of the world size where it is split
    between ranks."""
    count = max(1, nbytes // ITEMSIZE)
    if op in ("all_reduce", "broadcast"):
        return count
    return max(world_size, count - count % world_size)


# ---------------------------------------------------------------- workers


class ConcordCollectives:
    def __init__(self, plan: dict):
        import concord

        self.cc = concord
        concord.init()
        self.rank = concord.rank()
        self.size = concord.world_size()

    def barrier(self) -> None:
        self.cc.barrier()

    def max_over_ranks(self, values: np.ndarray) -> np.ndarray:
        self.cc.all_reduce(values, op="max", out=values)
        return values

    def bind(self, op: str, x: np.ndarray, y: np.ndarray):
        cc = self.cc
        if op == "all_reduce":
            return lambda: cc.all_reduce(x, op="sum", out=y)
        if op == "all_gather":
            return lambda: cc.all_gather(x, out=y)
        if op == "broadcast":
            # In place, as torch's and Open MPI's: the root's output holds its input.
            return lambda: cc.broadcast(y, root=0, out=y)
        return lambda: cc.reduce_scatter(x, out=y)

    def close(self) -> None:
        self.cc.shutdown()


class GlooCollectives:
    """torch.distributed over gloo, meeting at a TCP store on the port the
    parent chose."""

    def __init__(self, plan: dict):
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        address = os.environ.get("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group("gloo", init_method=f"tcp://{address}:{plan['torch_port']}",
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    def barrier(self) -> None:
        self.dist.barrier()

    def max_over_ranks(self, values: np.ndarray) -> np.ndarray:
        self.dist.all_reduce(self.torch.from_numpy(values), op=self.dist.ReduceOp.MAX)
        return values

    def bind(self, op: str, x: np.ndarray, y: np.ndarray):
        dist = self.dist
        xt, yt = self.torch.from_numpy(x), self.torch.from_numpy(y)
        if op == "all_reduce":
            # torch's all_reduce is in place only: it reduces the output
            # buffer, which check_result fills like the input.
            return lambda: dist.all_reduce(yt)
        if op == "all_gather":
            return lambda: dist.all_gather_into_tensor(yt, xt)
        if op == "broadcast":
            # In place only, like its all_reduce: the root's output holds its input.
            return lambda: dist.broadcast(yt, src=0)
        return lambda: dist.reduce_scatter_tensor(yt, xt)

    def close(self) -> None:
        self.dist.destroy_process_group()


class MpiCollectives:
    def __init__(self, plan: dict):
        from mpi4py import MPI

        self.mpi = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    def barrier(self) -> None:
        self.comm.Barrier()

    def max_over_ranks(self, values: np.ndarray) -> np.ndarray:
        self.comm.Allreduce(self.mpi.IN_PLACE, values, op=self.mpi.MAX)
        return values

    def bind(self, op: str, x: np.ndarray, y: np.ndarray):
        comm, mpi = self.comm, self.mpi
        if op == "all_reduce":
            return lambda: comm.Allreduce(x, y, op=mpi.SUM)
        if op == "all_gather":
            return lambda: comm.Allgather(x, y)
        if op == "broadcast":
            return lambda: comm.Bcast(y, root=0)  # in place
        return lambda: comm.Reduce_scatter_block(x, y, op=mpi.SUM)

    def close(self) -> None:
        pass  # mpi4py finalizes at exit


COLLECTIVES = {"concord": ConcordCollectives, "gloo": GlooCollectives, "mpi": MpiCollectives}


def buffers(op: str, count: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Input and output of one rank, written once so their pages are mapped
    before timing. Zeros keep torch's in-place all_reduce from overflowing
    across iterations."""
    in_count = count // world_size if op == "all_gather" else count
    out_count = count // world_size if op == "reduce_scatter" else count
    return np.zeros(in_count, DTYPE), np.zeros(out_count, DTYPE)


def check_result(coll, op: str, x: np.ndarray, y: np.ndarray, run) -> bool:
    """One more call on rank-dependent data, compared with NumPy, so a fast
    but wrong result is not reported as a win."""
    n = coll.size
    x.fill(coll.rank + 1)
    y.fill(coll.rank + 1)
    run()
    if op == "all_gather":
        expected = np.repeat(np.arange(1, n + 1, dtype=DTYPE), y.size // n)
        return bool(np.array_equal(y, expected))
    if op == "broadcast":
        return bool(np.all(y == 1))  # rank 0's value
    return bool(np.all(y == n * (n + 1) / 2))


def measure_op(coll, op: str, nbytes: int, budget: Budget) -> dict:
    count = element_count(op, nbytes, coll.size)
    x, y = buffers(op, count, coll.size)
    run = coll.bind(op, x, y)
    times = _timing.measure(run, budget, coll.barrier, coll.max_over_ranks)
    return {"op": op, "nbytes": count * ITEMSIZE, "median_s": float(np.median(times)),
            "iters": len(times), "correct": check_result(coll, op, x, y, run)}


def measure_latency(coll) -> dict:
    x, y = buffers("all_reduce", LATENCY_BYTES // ITEMSIZE, coll.size)
    run = coll.bind("all_reduce", x, y)
    for _ in range(LATENCY_WARMUP):
        run()
    times = _timing.timed_loop(run, LATENCY_ITERS, coll.barrier, coll.max_over_ranks)
    return {"median_s": float(np.median(times)), "iters": len(times)}


def run_worker(lib: str, plan_path: str, out_path: str) -> int:
    plan = _timing.read_json(plan_path)
    coll = COLLECTIVES[lib](plan)
    budget = Budget(**plan["budget"])
    results = {"measurements": [], "errors": {}, "latency": None, "done": False}

    def save() -> None:
        if coll.rank == 0:
            _timing.write_json(out_path, results)

    for op in plan["ops"]:
        for nbytes in plan["sizes"]:
            try:
                results["measurements"].append(measure_op(coll, op, nbytes, budget))
            except Exception as exc:  # the op is unsupported or broken: report it, go on
                results["errors"][op] = f"at {_timing.format_bytes(nbytes)}: {type(exc).__name__}: {exc}"
                break
            finally:
                save()
    if coll.size == TARGET_WORLD:
        try:
            results["latency"] = measure_latency(coll)
        except Exception as exc:
            results["errors"]["latency"] = f"{type(exc).__name__}: {exc}"
    results["done"] = True
    save()
    coll.close()
    return 0


# ----------------------------------------------------------------- parent


@dataclass
class LibRun:
    """What one library's job on one world size produced."""

    results: dict = field(default_factory=dict)
    failure: str | None = None

    def median_s(self, op: str, nbytes: int) -> float | None:
        for m in self.results.get("measurements", []):
            if m["op"] == op and m["nbytes"] == nbytes:
                return m["median_s"]
        return None


def default_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Down from max_bytes by factor, so the largest size is always
    measured, then min_bytes itself."""
    sizes = []
    size = max_bytes
    while size >= min_bytes:
        sizes.append(size)
        size //= factor
    if min_bytes not in sizes:
        sizes.append(min_bytes)
    return sorted(sizes)


def unavailable(lib: str) -> str | None:
    """Why a library cannot run here, or None."""
    concord_missing = importlib.util.find_spec("concord") is None
    if lib == "concord" and concord_missing:
        return "concord is not installed (make install)"
    if lib == "gloo":
        if importlib.util.find_spec("torch") is None:
            return "not installed (torch)"
        if concord_missing:
            return "concord is not installed, and its launcher starts the ranks"
    if lib == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return "not installed (mpi4py)"
        if shutil.which("mpirun") is None:
            return "not installed (mpirun, from openmpi-bin)"
    return None


def job_command(lib: str, n: int, plan_path: str, out_path: str) -> list[str]:
    worker = [os.path.abspath(__file__), "--worker", lib, "--plan", plan_path, "--out", out_path]
    if lib == "mpi":
        return ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(n), sys.executable, *worker]
    # As mpirun binds each rank to a core when there are enough of them.
    bind = ["--cpu-bind", "cores"] if n <= len(os.sched_getaffinity(0)) else []
    return [sys.executable, "-m", "concord.run", "-n", str(n), "--timeout", str(COLLECTIVE_TIMEOUT_S),
            *bind, *worker]


def job_env(lib: str, n: int) -> dict[str, str]:
    env = dict(os.environ)
    if lib == "mpi":
        # One host: shared memory between ranks, no network transports.
        env.setdefault("OMPI_MCA_btl", "vader,self")
        env.setdefault("OMPI_MCA_pml", "ob1")
        if n > (os.cpu_count() or 1):
            # Busy-polling ranks starve each other when they outnumber cores.
            env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    return env


def run_lib(lib: str, n: int, plan: dict, mode: Mode, workdir: str) -> LibRun:
    plan_path = os.path.join(workdir, f"plan-{lib}-{n}.json")
    out_path = os.path.join(workdir, f"result-{lib}-{n}.json")
    plan = dict(plan, torch_port=_timing.free_port())
    _timing.write_json(plan_path, plan)
    print(f"bench: {LABELS[lib]} on {n} ranks ...", file=sys.stderr, flush=True)
    outcome = _timing.run_job(job_command(lib, n, plan_path, out_path), job_env(lib, n), mode.job_timeout_s)
    results = _timing.read_json(out_path) or {}
    failure = outcome.failure()
    if failure is None and not results.get("done"):
        failure = "exited without writing all its results"
    print(f"bench: {LABELS[lib]} on {n} ranks: {outcome.seconds:.0f} s"
          + (f", FAILED: {failure}" if failure else ""), file=sys.stderr, flush=True)
    return LibRun(results, failure)


# ----------------------------------------------------------------- report


def fmt_us(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    us = seconds * 1e6
    return f"{us:.2f}" if us < 100 else f"{us:.1f}" if us < 1e5 else f"{us:.0f}"


def fmt_gbs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}" if value < 1 else f"{value:.2f}"


def fmt_ratio(theirs: float | None, ours: float | None) -> str:
    return "-" if theirs is None or ours is None else f"{theirs / ours:.2f}"


def copy_bytes(op: str, nbytes: int, n: int) -> float:
    """The memory bound's model: bytes each rank must copy at least (a copy
    reads a byte once and writes it once), for size nbytes on n ranks.
    all_gather and broadcast write the whole result from inputs read once;
    reduce_scatter reads the whole input and writes its 1/n part (as much
    traffic as copying (1 + 1/n)/2 of it); all_reduce reduces its 1/n share
    that way, then copies the other n - 1 shares of the result."""
    reduce_part = (nbytes + nbytes / n) / 2
    return {"all_gather": nbytes, "broadcast": nbytes, "reduce_scatter": reduce_part,
            "all_reduce": reduce_part + nbytes * (n - 1) / n}[op]


def bound_s(op: str, nbytes: int, n: int, bandwidths: dict[int, float]) -> float:
    """Time the memory system allows: every rank's copies at the copy
    bandwidth of min(n, cores) threads copying at once (ranks beyond the
    cores share them)."""
    threads = min(n, max(bandwidths))
    return n * copy_bytes(op, nbytes, n) / (bandwidths[threads] * _timing.GB)


def table_rows(op: str, n: int, libs: list[str], runs: dict,
               bandwidths: dict[int, float]) -> list[list[str]]:
    sizes = sorted({m["nbytes"] for lib in libs for m in runs[(lib, n)].results.get("measurements", [])
                    if m["op"] == op})
    rows = []
    for nbytes in sizes:
        ours = runs[("concord", n)].median_s(op, nbytes) if "concord" in libs else None
        row = [_timing.format_bytes(nbytes)]
        for lib in libs:
            t = runs[(lib, n)].median_s(op, nbytes)
            row += [fmt_us(t), fmt_gbs(None if t is None else _timing.algbw(nbytes, t)),
                    fmt_gbs(None if t is None else _timing.busbw(op, nbytes, t, n))]
            if lib != "concord":
                row.append(fmt_ratio(t, ours))
        if nbytes >= BOUND_FROM_BYTES:
            bound = bound_s(op, nbytes, n, bandwidths)
            row += [fmt_us(bound), "-" if ours is None else f"{100 * bound / ours:.0f}%"]
        else:
            row += ["", ""]
        rows.append(row)
    return rows


def table_headers(libs: list[str]) -> list[str]:
    headers = ["size"]
    for lib in libs:
        s = SHORT[lib]
        headers += [f"{s} us", f"{s} algbw", f"{s} busbw"]
        if lib != "concord":
            headers.append(f"{s}/cc")
    return headers + ["bound us", "cc of bound"]


def table_notes(op: str, n: int, libs: list[str], runs: dict, missing: dict[str, str]) -> list[str]:
    notes = [f"{LABELS[lib]}: columns omitted, {why}" for lib, why in missing.items()]
    for lib in libs:
        run = runs[(lib, n)]
        if run.failure:
            notes.append(f"{LABELS[lib]}: job failed, see 'failed jobs' below")
        if op in run.results.get("errors", {}):
            notes.append(f"{LABELS[lib]}: {op} failed {run.results['errors'][op]}")
        wrong = [_timing.format_bytes(m["nbytes"]) for m in run.results.get("measurements", [])
                 if m["op"] == op and not m["correct"]]
        if wrong:
            notes.append(f"{LABELS[lib]}: WRONG RESULT at {', '.join(wrong)} (times shown anyway)")
    return notes


def print_tables(args, libs: list[str], runs: dict, missing: dict[str, str],
                 bandwidths: dict[int, float]) -> None:
    for op in args.ops:
        for n in args.nprocs:
            factor = {"all_reduce": "2(n-1)/n", "broadcast": "1"}.get(op, "(n-1)/n")
            summed = " sum" if op in ("all_reduce", "reduce_scatter") else ""
            print(f"\n{op}  float32{summed}  {n} ranks"
                  f"  (busbw = algbw * {factor} = algbw * {_timing.bus_factor(op, n):.2f})")
            print(_timing.format_table(table_headers(libs), table_rows(op, n, libs, runs, bandwidths)))
            for note in table_notes(op, n, libs, runs, missing):
                print(f"  note: {note}")


def print_header(mode: Mode, libs: list[str]) -> None:
    print(f"CPU collectives: {', '.join(LABELS[lib] for lib in libs)}; "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, NumPy {np.__version__}")
    for lib in libs:
        print(f"  {LABELS[lib]}: {lib_version(lib)}")
    print("size: each rank's buffer for all_reduce and broadcast (root 0); the full output (world size\n"
          "  x each rank's input) for all_gather; the full input for reduce_scatter (each rank keeps\n"
          "  size/n), as nccl-tests. Every broadcast and torch's all_reduce run in place (the others\n"
          "  out of place).\n"
          "us: median over iterations of the slowest rank's time (each rank times every iteration,\n"
          "  the times are reduced with MAX), after warm-up, with a barrier before the timed loop;\n"
          f"  iterations adapt to the size ({mode.budget.min_iters}..{mode.budget.max_iters}, "
          f"about {mode.budget.seconds:g} s each).\n"
          "algbw = size / time and busbw = algbw * 2(n-1)/n (all_reduce) or * (n-1)/n (all_gather,\n"
          "  reduce_scatter), in GB/s (1e9 bytes/s).\n"
          "gloo/cc, mpi/cc: the peer's time / concord's time; > 1 means concord is faster.\n"
          f"bound (from {_timing.format_bytes(BOUND_FROM_BYTES)}): the time the memory system allows for the bytes each\n"
          "  rank must copy at least (all_gather, broadcast: the size; reduce_scatter: (1 + 1/n)/2 of\n"
          "  it, reading it all and writing 1/n; all_reduce: that plus (n-1)/n of the size, the other\n"
          "  ranks' shares of the result), every rank copying at\n"
          "  once at the copy bandwidth measured with min(n, cores) threads; cc of bound = bound /\n"
          "  concord's time.\n"
          "Every measurement ends with one call on rank-dependent data checked against NumPy.")
    print_load("start")


def print_load(when: str) -> None:
    # Other work on the machine skews every column; the load says how much to trust them.
    print(f"load average (1, 5, 15 min) at {when}: "
          + ", ".join(f"{load:.2f}" for load in os.getloadavg()), flush=True)


def lib_version(lib: str) -> str:
    packages = {"concord": ["concord"], "gloo": ["torch"], "mpi": ["mpi4py"]}[lib]
    versions = []
    for package in packages:
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} (version unknown)")
    if lib == "mpi":
        probe = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, check=False)
        versions.append((probe.stdout.splitlines() or ["mpirun"])[0])
    return ", ".join(versions)


def latency_of(runs: dict, lib: str) -> float | None:
    run = runs.get((lib, TARGET_WORLD))
    latency = run and run.results.get("latency")
    return latency["median_s"] if latency else None


def why_absent(lib: str, n: int, runs: dict, missing: dict[str, str], key: str) -> str:
    """Why a library has no value for `key` (an op or "latency") on n ranks."""
    if lib in missing:
        return missing[lib]
    run = runs.get((lib, n))
    if run is None:
        return "not run (--libs, --nprocs)"
    if key in run.results.get("errors", {}):
        return f"{key} failed {run.results['errors'][key]}"
    if run.failure:
        return "job failed, see 'failed jobs' above"
    return "not measured"


def print_latency(libs: list[str], runs: dict, missing: dict[str, str]) -> None:
    print(f"\n{LATENCY_BYTES}-byte all_reduce from Python, {TARGET_WORLD} ranks: median of "
          f"{LATENCY_ITERS} iterations (slowest rank each), after {LATENCY_WARMUP} warm-up")
    for lib in libs:
        latency = latency_of(runs, lib)
        shown = f"{fmt_us(latency)} us" if latency else why_absent(lib, TARGET_WORLD, runs, missing, "latency")
        print(f"  {LABELS[lib]:<11} {shown}")


def print_failures(libs: list[str], nprocs: list[int], runs: dict) -> None:
    failed = [(lib, n) for n in nprocs for lib in libs if runs[(lib, n)].failure]
    if failed:
        print("\nfailed jobs (their tables show what they measured before failing)")
    for lib, n in failed:
        print(f"  {LABELS[lib]} on {n} ranks: {runs[(lib, n)].failure}")


def target_line(description: str, value: float | None, passed, shown: str, why_missing: str) -> str:
    if value is None:
        return f"  n/a   {description}: {why_missing}"
    return f"  {'PASS' if passed(value) else 'FAIL'}  {description}: {shown}"


def ratio_target(peer: str, goal: float, runs: dict, missing: dict[str, str], sizes: list[int]) -> str:
    ours = runs.get(("concord", TARGET_WORLD))
    theirs = runs.get((peer, TARGET_WORLD))
    ours_t = ours and ours.median_s("all_reduce", TARGET_BYTES)
    theirs_t = theirs and theirs.median_s("all_reduce", TARGET_BYTES)
    ratio = theirs_t / ours_t if ours_t and theirs_t else None
    what = f"{goal:g}x {LABELS[peer]}'s" if goal != 1 else f"at least {LABELS[peer]}'s"
    description = (f"{_timing.format_bytes(TARGET_BYTES)} float32 all_reduce on {TARGET_WORLD} ranks, "
                   f"concord algbw {what}")
    if TARGET_BYTES not in sizes:
        why = f"{_timing.format_bytes(TARGET_BYTES)} is not among the sizes"
    elif not ours_t:
        why = f"concord: {why_absent('concord', TARGET_WORLD, runs, missing, 'all_reduce')}"
    else:
        why = f"{LABELS[peer]}: {why_absent(peer, TARGET_WORLD, runs, missing, 'all_reduce')}"
    return target_line(description, ratio, lambda r: r >= goal, f"{ratio:.2f}x" if ratio else "", why)


def print_targets(runs: dict, missing: dict[str, str], sizes: list[int]) -> None:
    print("\ntargets")
    print(ratio_target("gloo", TARGET_GLOO_RATIO, runs, missing, sizes))
    print(ratio_target("mpi", TARGET_MPI_RATIO, runs, missing, sizes))
    latency = latency_of(runs, "concord")
    print(target_line(f"{LATENCY_BYTES}-byte all_reduce from Python on {TARGET_WORLD} ranks under "
                      f"{TARGET_LATENCY_US:g} us median", latency, lambda s: s * 1e6 < TARGET_LATENCY_US,
                      f"{fmt_us(latency)} us", why_absent("concord", TARGET_WORLD, runs, missing, "latency")))


def run_parent(args) -> int:
    mode = QUICK if args.quick else FULL
    sizes = (sorted(set(args.sizes)) if args.sizes
             else default_sizes(args.min_bytes, args.max_bytes or mode.max_bytes, mode.size_factor))
    missing = {lib: why for lib in args.libs if (why := unavailable(lib))}
    libs = [lib for lib in args.libs if lib not in missing]
    plan = {"ops": args.ops, "sizes": sizes, "budget": asdict(mode.budget)}
    print_header(mode, libs)
    print(f"\nmemcpy, one thread (numpy copy of {_timing.format_bytes(MEMCPY_BYTES)} into a preallocated "
          f"array, median of {mode.memcpy_reps}): "
          f"{_timing.memcpy_bandwidth(MEMCPY_BYTES, mode.memcpy_reps):.2f} GB/s", flush=True)
    bandwidths = copy_bandwidths(mode)
    with tempfile.TemporaryDirectory(prefix="concord-bench-") as workdir:
        runs = {(lib, n): run_lib(lib, n, plan, mode, workdir) for n in args.nprocs for lib in libs}
    print_tables(args, libs, runs, missing, bandwidths)
    print_failures(libs, args.nprocs, runs)
    print_latency(libs, runs, missing)
    print_targets(runs, missing, sizes)
    print_cell_targets(args, libs, runs, bandwidths)
    plot(args, libs, runs)
    print_load("end")
    return 0


def copy_bandwidths(mode: Mode) -> dict[int, float]:
    """Copy bandwidth (GB/s, all threads together) of 1 .. cores threads
    copying at once: the memory bound's denominators."""
    cores = os.cpu_count() or 1
    bandwidths = {threads: _timing.concurrent_memcpy_bandwidth(BOUND_COPY_BYTES, mode.memcpy_reps, threads)
                  for threads in range(1, cores + 1)}
    print("memcpy, several threads at once (each its own "
          f"{_timing.format_bytes(BOUND_COPY_BYTES)}; GB/s of all together): "
          + ", ".join(f"{threads}: {bw:.2f}" for threads, bw in bandwidths.items()), flush=True)
    return bandwidths


def print_cell_targets(args, libs: list[str], runs: dict, bandwidths: dict[int, float]) -> None:
    """Every cell against the peers, and the large cells against the memory bound."""
    for peer, goal in (("mpi", TARGET_MPI_RATIO), ("gloo", TARGET_GLOO_RATIO)):
        if peer not in libs or "concord" not in libs:
            continue
        behind, cells = [], 0
        for op in args.ops:
            for n in args.nprocs:
                for m in runs[("concord", n)].results.get("measurements", []):
                    if m["op"] != op:
                        continue
                    theirs = runs[(peer, n)].median_s(op, m["nbytes"])
                    if theirs is None:
                        continue
                    cells += 1
                    if theirs / m["median_s"] < goal:
                        behind.append(f"{op} {n} ranks {_timing.format_bytes(m['nbytes'])} "
                                      f"({theirs / m['median_s']:.2f}x)")
        what = f"at least {LABELS[peer]}'s speed" if goal == 1 else f"{goal:g}x {LABELS[peer]}'s speed"
        status = "PASS" if not behind else "FAIL"
        print(f"  {status}  {what} on every cell ({cells - len(behind)} of {cells})"
              + ("" if not behind else ": below on " + "; ".join(behind)))
    if "concord" in libs:
        for n in args.nprocs:
            for op in args.ops:
                ours = runs[("concord", n)].median_s(op, TARGET_BYTES)
                if ours is None:
                    continue
                fraction = bound_s(op, TARGET_BYTES, n, bandwidths) / ours
                print(f"  {'PASS' if fraction >= TARGET_BOUND_FRACTION else 'FAIL'}  "
                      f"{op} {_timing.format_bytes(TARGET_BYTES)} on {n} ranks at least "
                      f"{TARGET_BOUND_FRACTION:.0%} of the memory bound: {fraction:.0%}")


def plot(args, libs: list[str], runs: dict) -> None:
    """algbw against size for every library, one panel per op and world
    size, written as a PNG when matplotlib is installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\nplot: not written (matplotlib is not installed)")
        return
    fig, axes = plt.subplots(len(args.nprocs), len(args.ops), squeeze=False,
                             figsize=(4.2 * len(args.ops), 3.4 * len(args.nprocs)))
    for row, n in enumerate(args.nprocs):
        for col, op in enumerate(args.ops):
            ax = axes[row][col]
            for lib in libs:
                points = sorted((m["nbytes"], _timing.algbw(m["nbytes"], m["median_s"]))
                                for m in runs[(lib, n)].results.get("measurements", []) if m["op"] == op)
                if points:
                    ax.plot(*zip(*points), marker="o", markersize=3, label=LABELS[lib])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{op}, {n} ranks", fontsize=10)
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel("algbw (GB/s)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"\nplot: algbw against size written to {os.path.abspath(args.plot)}")


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer sizes and iterations (about a minute)")
    parser.add_argument("--nprocs", default="2,4", type=lambda s: [int(v) for v in s.split(",")],
                        help="world sizes, comma-separated (default 2,4)")
    parser.add_argument("--sizes", type=lambda s: [_timing.parse_bytes(v) for v in s.split(",")],
                        help="message sizes, comma-separated, K/M/G suffixes allowed (overrides the range)")
    parser.add_argument("--min-bytes", type=_timing.parse_bytes, default=8, help="smallest size (default 8)")
    parser.add_argument("--max-bytes", type=_timing.parse_bytes,
                        help="largest size (default 256M, 64M with --quick); sizes step by 4 (16 with --quick)")
    parser.add_argument("--ops", default=",".join(OPS), type=lambda s: s.split(","),
                        help=f"operations, comma-separated (default {','.join(OPS)})")
    parser.add_argument("--libs", default=",".join(LIBS), type=lambda s: s.split(","),
                        help=f"libraries, comma-separated (default {','.join(LIBS)})")
    parser.add_argument("--plot", default="allreduce_cpu.png",
                        help="where to write the algbw plot (PNG; needs matplotlib)")
    parser.add_argument("--worker", choices=LIBS, help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name, chosen, allowed in (("--ops", args.ops, OPS), ("--libs", args.libs, LIBS)):
        if unknown := set(chosen) - set(allowed):
            parser.error(f"{name}: unknown {', '.join(sorted(unknown))}; choose from {', '.join(allowed)}")
    if any(n < 1 for n in args.nprocs):
        parser.error("--nprocs: world sizes must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return run_worker(args.worker, args.plan, args.out)
    try:
        return run_parent(args)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
