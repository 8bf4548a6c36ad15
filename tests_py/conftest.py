"""Shared fixtures: a clean job environment, fresh random seeds, a world of
one in this process, ranks run as threads of this process (cheap
multi-rank checks), and what the GPU tests need (the `gpu` marker, CUDA
array libraries, ranks as fresh processes sharing the GPU). Shared helper
functions are in helpers.py."""

import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import concord as cc
from concord import _capi

# --import-mode=importlib puts no test directory on sys.path; the test
# modules (and the ranks they start) import helpers.py by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Rendezvous settings the test process may have inherited (from a launcher
# running the suite, say); every job here starts from a clean slate. Of
# concord's own variables, three are settings of the machine rather than of
# a job, and stay: where the CUDA plugin and NCCL are (CONCORD_CUDA_PLUGIN,
# CONCORD_NCCL_LIBRARY) and the default timeout (CONCORD_TIMEOUT).
_JOB_VARIABLE = re.compile(r"(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT"
                           r"|CONCORD_(?!(?:CUDA_PLUGIN|NCCL_LIBRARY|TIMEOUT)$).*"
                           r"|OMPI_.*|PMI_.*|SLURM_.*)")


def pytest_configure(config):
    config.addinivalue_line("markers", "jax: uses JAX in the test process; runs after the "
                                       "other tests")
    # This process runs torch ops on several threads, and forks the ranks of
    # concord.launch, which warns; no rank forked here runs a parallel torch
    # op (the test of that hazard starts its ranks with spawn).
    config.addinivalue_line("filterwarnings", "ignore::concord.notebook.UnsafeForkWarning")


def pytest_collection_modifyitems(items):
    # JAX starts threads once it is used, and a process running them must
    # not fork (JAX warns: the children may deadlock), which many tests do
    # to start ranks; the tests using JAX here run after all of them.
    items.sort(key=lambda item: item.get_closest_marker("jax") is not None)


@pytest.fixture(autouse=True)
def _clean_job(monkeypatch):
    for name in list(os.environ):
        if _JOB_VARIABLE.fullmatch(name):
            monkeypatch.delenv(name)
    yield
    cc.shutdown()


@pytest.fixture
def seed():
    """A fresh random seed for the test's data; a failing test reports it."""
    return secrets.randbits(32)


@pytest.fixture
def rng(seed):
    """A random generator seeded with the test's `seed`."""
    return np.random.default_rng(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    seed = getattr(item, "funcargs", {}).get("seed")
    if report.failed and seed is not None:
        report.sections.append(("seed", f"the test's data came from seed {seed}"))
    return report


@pytest.fixture
def world1():
    """This process as a world of one."""
    return cc.init(timeout=30.0)


def _run_thread_ranks(nranks, fn, *, timeout=30.0):
    """Runs fn(comm) on `nranks` threads, each a rank of one communicator
    meeting through a store served here; returns the results in rank order
    and re-raises the first rank's exception, if any."""
    token = secrets.token_hex(8)
    results = [None] * nranks
    errors = [None] * nranks

    with _capi.StoreServer("127.0.0.1", 0, token) as server:
        def rank_main(rank):
            try:
                with _capi.Store("127.0.0.1", server.port, token, timeout) as store:
                    handle = _capi.Comm.from_store(store, "threads", rank, nranks, timeout)
                    with cc.Communicator(handle) as comm:
                        results[rank] = fn(comm)
            except BaseException as exc:  # reported by the caller
                errors[rank] = exc

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(nranks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for error in errors:
        if error is not None:
            raise error
    return results


@pytest.fixture
def thread_ranks():
    """run(nranks, fn) -> [fn(comm) per rank]: ranks as threads of this process."""
    return _run_thread_ranks


# ---- GPU tests ------------------------------------------------------------------
# Tests marked `gpu` need torch with a CUDA device. Where there is none they
# skip with the reason, so the same suite runs on CPU-only machines and on
# GPU machines.


def _warning_texts(caught):
    return "; ".join(f"{w.category.__name__}: {w.message}" for w in caught)


@functools.cache
def cuda_problem():
    """Why the GPU tests cannot run here, or None when they can."""
    # Warnings while importing torch or probing CUDA (torch's "CUDA
    # initialization: ..." when the driver is missing or too old, say) are
    # recorded here, not turned into errors by the suite's filterwarnings,
    # and explain a skip.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import torch
        except ModuleNotFoundError as exc:
            if exc.name == "torch":
                return "needs torch with CUDA: torch is not installed"
            return f"needs torch with CUDA: torch failed to import: {exc}"
        except Exception as exc:  # installed, but a library of its own does not load
            return f"needs torch with CUDA: torch failed to import: {type(exc).__name__}: {exc}"
        available = torch.cuda.is_available()
    if not available:
        built = f"CUDA {torch.version.cuda}" if torch.version.cuda else "without CUDA"
        problem = f"needs a CUDA device: torch {torch.__version__} ({built}) sees none"
        if caught:
            problem += f" ({_warning_texts(caught)})"
        return problem
    return None


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None:
        problem = cuda_problem()
        if problem is not None:
            pytest.skip(problem)


@pytest.fixture
def torch_cuda():
    """The torch module, on a machine with a CUDA device (skips otherwise)."""
    problem = cuda_problem()
    if problem is not None:
        pytest.skip(problem)
    import torch

    return torch


@pytest.fixture
def cupy_cuda():
    """The cupy module, when it is installed and sees a CUDA device (skips
    otherwise)."""
    try:
        import cupy
    except ImportError:
        pytest.skip("needs CuPy: cupy is not installed")
    except Exception as exc:  # installed, but its CUDA libraries do not load
        pytest.skip(f"needs CuPy: importing cupy failed: {exc}")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        pytest.skip(f"needs a CUDA device: cupy sees none ({exc})")
    if count < 1:
        pytest.skip("needs a CUDA device: cupy sees none")
    return cupy


_GPU_WORKER = Path(__file__).with_name("gpu_helpers.py")


def _children(pid):
    """The pids of the live children of process `pid`."""
    children = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children.update(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            pass
    if not children and shutil.which("pgrep"):  # a kernel without /proc/*/task/*/children
        try:
            listed = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True,
                                    timeout=30)
        except (OSError, subprocess.SubprocessError):
            return children
        children.update(int(c) for c in listed.stdout.split() if c.isdigit())
    return children


def _kill_rank_groups(launcher_pid):
    """SIGKILL to the process group of every child of the launcher: each
    rank leads its own session and group (concord.run starts them with
    start_new_session), which also holds what the rank started."""
    groups = set()
    for child in _children(launcher_pid):
        try:
            groups.add(os.getpgid(child))
        except ProcessLookupError:
            pass
    for group in groups - {os.getpgrp()}:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _stop_job(process, grace_s=10.0):
    """Stops a launcher and every rank it started. The launcher leads its own
    session and process group; each rank leads another (concord.run starts
    them with start_new_session), so a signal to the launcher's group does
    not reach them. SIGTERM goes to the launcher's group, and the launcher
    passes it on to its ranks and waits for them; if it is still there after
    `grace_s`, SIGKILL goes to the ranks' groups and to the launcher's, so
    that no rank is left holding the GPU."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return process.communicate()
    try:
        return process.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        # Stopped, the launcher starts no rank while its children are
        # listed; once it is gone they would no longer be its children.
        os.killpg(process.pid, signal.SIGSTOP)
        _kill_rank_groups(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return process.communicate()


def _run_process_ranks(module_file, tmp_path, nprocs, fn, *args, timeout=600.0):
    """Runs fn(*args) (a module-level function of the test module, whose
    arguments and result are JSON) as `nprocs` ranks of one concord-run job
    of fresh processes; returns the results in rank order."""
    out_dir = tmp_path / f"ranks-{fn.__name__}-{secrets.token_hex(4)}"
    out_dir.mkdir()
    command = [sys.executable, "-m", "concord.run", "-n", str(nprocs), str(_GPU_WORKER),
               str(module_file), fn.__name__, json.dumps(args), str(out_dir)]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, errors="replace",
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        how = f"exited with status {process.returncode}"
    except subprocess.TimeoutExpired:
        stdout, stderr = _stop_job(process)
        how = f"was stopped after {timeout:.0f} s"
    except BaseException:
        _stop_job(process)
        raise
    if process.returncode != 0:
        raise AssertionError(f"{nprocs} ranks of {fn.__name__}: the job {how}\n"
                             f"--- stdout (end) ---\n{stdout[-6000:]}\n"
                             f"--- stderr (end) ---\n{stderr[-6000:]}")
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(nprocs)]


@pytest.fixture
def process_ranks(request, tmp_path):
    """run(nprocs, fn, *args) -> [fn(*args) per rank]: ranks as fresh
    processes under concord-run (not forked from this process, which may
    hold a CUDA context already). fn must be a module-level function of the
    requesting test module; arguments and results travel as JSON."""
    return functools.partial(_run_process_ranks, request.module.__file__, tmp_path)
