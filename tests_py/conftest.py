"""Shared fixtures: a clean job environment, a world of one in this process,
ranks run as threads of this process (cheap multi-rank checks), and what
the GPU tests need (the `gpu` marker, CUDA array libraries, ranks as fresh
processes sharing the GPU)."""

import functools
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import concord as cc
from concord import _capi

# Rendezvous settings the test process may have inherited (from a launcher
# running the suite, say); every job here starts from a clean slate.
_JOB_VARIABLE = re.compile(r"(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT"
                           r"|CONCORD_.*|OMPI_.*|PMI_.*|SLURM_.*)")


@pytest.fixture(autouse=True)
def _clean_job(monkeypatch):
    for name in list(os.environ):
        if _JOB_VARIABLE.fullmatch(name):
            monkeypatch.delenv(name)
    yield
    cc.shutdown()


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


@functools.cache
def cuda_problem():
    """Why the GPU tests cannot run here, or None when they can."""
    try:
        import torch
    except ImportError:
        return "needs torch with CUDA: torch is not installed"
    if not torch.cuda.is_available():
        built = f"CUDA {torch.version.cuda}" if torch.version.cuda else "without CUDA"
        return f"needs a CUDA device: torch {torch.__version__} ({built}) sees none"
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


def _stop_job(process, grace_s=10.0):
    """Stops a launcher and every rank it started (they share its session)."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            break
        try:
            return process.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
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
