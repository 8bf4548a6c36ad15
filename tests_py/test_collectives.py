"""Every collective against a NumPy reference, on fresh random data.

The multi-rank checks run in the ranks of one concord.launch job per world
size (starting ranks is the cost); each rank returns the checks that failed.
Every rank generates every rank's data from (seed, rank, case), so each can
compute the reference itself.
"""

import os
import sys
import threading
import time

import numpy as np
import pytest

import concord as cc
from concord import arrays
from collective_checks import Checks, difference
from helpers import rank_data, reference_reduce, report

DTYPES = ["float16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool"]
LARGE = 1000003
SIZES = [0, 1, 7, 10007, LARGE]  # 10007 float32: past the one-shot path, within one chunk
def _check_everything(seed):
    cc.init(timeout=120.0)
    checks = Checks(seed)
    last = checks.size - 1
    for dtype in DTYPES:
        for size in SIZES:
            large = size == LARGE
            checks.all_reduce(dtype, (size,), variants=not large)
            checks.all_gather(dtype, (size,), variants=not large)
            checks.reduce_scatter(dtype, size if not large else LARGE // checks.size,
                                  variants=not large)
            checks.broadcast(dtype, (size,), [last] if large else range(checks.size))
        checks.all_reduce(dtype, ())
        checks.all_reduce(dtype, (3, 5))
        checks.all_gather_axes(dtype)
        checks.reduce_scatter_axes(dtype)
    cc.barrier()
    return checks.failures


def _check_many_chunks(seed, chunk_bytes):
    os.environ["CONCORD_SHM_CHUNK_BYTES"] = str(chunk_bytes)
    cc.init(timeout=120.0)
    checks = Checks(seed)
    for dtype in ["float16", "float32", "float64", "int8", "int64", "bool"]:
        per_chunk = chunk_bytes // np.dtype(dtype).itemsize
        for size in [per_chunk - 1, per_chunk, per_chunk + 1, 3 * per_chunk + 5, LARGE]:
            checks.all_reduce(dtype, (size,), variants=False)
            checks.all_gather(dtype, (size,), variants=False)
            checks.reduce_scatter(dtype, size if size != LARGE else LARGE // checks.size,
                                  variants=False)
            checks.broadcast(dtype, (size,), [0])
    return checks.failures


def _report(seed, per_rank_failures):
    return report([failure for rank in per_rank_failures for failure in rank], seed)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_collectives_match_numpy(nprocs, seed):
    results = cc.launch(_check_everything, nprocs, seed)
    assert not any(results), _report(seed, results)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_collectives_over_many_shm_chunks(nprocs, seed):
    results = cc.launch(_check_many_chunks, nprocs, seed, 65536)
    assert not any(results), _report(seed, results)


# ---- single process: result types, scalars, the DLPack path ----------------


def test_scalars_and_sequences_become_numpy(world1):
    result = cc.all_reduce(3.5)
    assert type(result) is np.ndarray and result.shape == () and result == 3.5
    result = cc.all_gather([1, 2, 3])
    assert type(result) is np.ndarray and result.tolist() == [1, 2, 3]


def test_communicator_methods_match_module_functions(world1):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(world1.all_reduce(x, "max"), x)
    assert np.array_equal(world1.all_gather(x, axis=1, tiled=False), x[:, None, :])
    assert np.array_equal(world1.reduce_scatter(x, axis=1), x)
    assert np.array_equal(world1.broadcast(x, 0), x)
    world1.barrier()


def test_numpy_inputs_bypass_the_namespace_machinery(world1, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("array-api-compat was consulted for a NumPy array")

    monkeypatch.setattr(arrays, "array_namespace", forbidden)
    monkeypatch.setattr(arrays, "device", forbidden)
    x = np.arange(4.0)
    assert cc.all_reduce(x).tolist() == x.tolist()
    assert cc.all_reduce(x, out=np.empty(4)).tolist() == x.tolist()
    assert cc.broadcast(x).tolist() == x.tolist()
    assert cc.all_gather(x.reshape(2, 2), axis=1).tolist() == x.reshape(2, 2).tolist()
    assert cc.reduce_scatter(x.reshape(2, 2), axis=1).tolist() == x.reshape(2, 2).tolist()


class _Subclass(np.ndarray):
    """A NumPy subclass: not the NumPy fast path, so it travels by DLPack."""


def test_arrays_without_the_numpy_fast_path_go_through_dlpack(world1):
    x = np.arange(10, dtype=np.int32).view(_Subclass)
    result = cc.all_reduce(x, "sum")
    assert isinstance(result, np.ndarray) and np.array_equal(result, np.arange(10))
    out = np.zeros(10, np.int32).view(_Subclass)
    assert cc.all_reduce(x, out=out) is out and np.array_equal(out, np.arange(10))
    assert cc.all_reduce(out, out=out) is out and np.array_equal(out, np.arange(10))


class _LegacyProducer:
    """A producer from before DLPack 1.0: __dlpack__ takes no max_version."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_capsules_are_consumed_and_released_once(world1):
    send = np.arange(1000, dtype=np.float64).view(_Subclass)
    recv = np.zeros(1000, np.float64)
    legacy_send = _LegacyProducer(np.arange(1000, dtype=np.float64))
    before = sys.getrefcount(send), sys.getrefcount(legacy_send.array)
    handle = world1._handle
    handle.all_reduce(send, recv, "sum", False)
    assert np.array_equal(recv, np.arange(1000))
    handle.all_reduce(legacy_send, recv, "max", False)
    work = handle.all_reduce(send, recv, "sum", True)
    assert work.wait() is recv
    del work
    # Each deleter dropped the reference its capsule held, exactly once.
    assert (sys.getrefcount(send), sys.getrefcount(legacy_send.array)) == before


def test_async_work_keeps_its_arrays_alive(world1):
    work = cc.all_reduce(np.arange(100_000, dtype=np.float32), async_op=True)
    result = work.wait()
    assert np.array_equal(result, np.arange(100_000, dtype=np.float32))
    assert work.wait() is result  # waiting again returns the same result
    assert work.test() and work.done()


def test_dropping_unfinished_work_is_safe(world1):
    for _ in range(20):
        cc.all_reduce(np.ones(50_000, np.float64), async_op=True)
    assert cc.all_reduce(np.ones(3)).tolist() == [1, 1, 1]


def test_waiting_less_than_the_collective_takes(thread_ranks):
    rank0_waited = threading.Event()

    def rank_main(comm):
        if comm.rank == 1:
            rank0_waited.wait(30)
            return cc.all_reduce(np.ones(3), comm=comm)
        work = cc.all_reduce(np.ones(3), comm=comm, async_op=True)
        try:
            with pytest.raises(cc.CollectiveTimeoutError):
                work.wait(timeout=0.05)
            assert not work.done()
        finally:
            rank0_waited.set()
        return work.wait()

    for result in thread_ranks(2, rank_main):
        assert result.tolist() == [2, 2, 2]


def test_wait_timeouts(thread_ranks):
    def rank_main(comm):
        results = []
        for timeout in (None, float("inf"), 1e12, 30):
            results.append(cc.all_reduce(np.ones(3), comm=comm, async_op=True)
                           .wait(timeout=timeout).tolist())
        work = cc.all_reduce(np.ones(3), comm=comm, async_op=True)
        for bad in (float("nan"), -1, -0.5, float("-inf")):
            with pytest.raises(cc.InvalidArgumentError) as info:
                work.wait(timeout=bad)
            assert str(info.value) == ("Work.wait: timeout must be None or a number of "
                                       f"seconds >= 0, got {bad!r}")
        results.append(work.wait().tolist())
        return results

    for results in thread_ranks(2, rank_main):
        assert results == [[2.0, 2.0, 2.0]] * 5


def test_wait_lasts_as_long_as_the_queued_collectives(thread_ranks):
    # Each of three queued collectives takes most of the 1 s timeout, as the
    # peer joins them late; all succeed, and so must the wait for the last,
    # though it ends well after 1 s.
    def rank_main(comm):
        if comm.rank == 1:
            for _ in range(3):
                time.sleep(0.6)
                cc.all_reduce(np.ones(2), comm=comm)
            return None
        works = [cc.all_reduce(np.ones(2), comm=comm, async_op=True) for _ in range(3)]
        start = time.monotonic()
        result = works[-1].wait()
        return result.tolist(), time.monotonic() - start

    result, waited = thread_ranks(2, rank_main, timeout=1.0)[0]
    assert result == [2.0, 2.0] and waited > 1.0


def test_wait_reports_a_silent_peer_as_the_collective_does(thread_ranks):
    def rank_main(comm):
        if comm.rank == 1:
            time.sleep(1.5)  # never joins
            return None
        with pytest.raises(cc.CollectiveTimeoutError) as info:
            cc.all_reduce(np.ones(2), comm=comm, async_op=True).wait()
        return str(info.value)

    message = thread_ranks(2, rank_main, timeout=0.5)[0]
    assert "all_reduce #0 on rank 0 failed: timed out after 0.5 s" in message
    assert "not heard from ranks [1]" in message


def test_threads_as_ranks(thread_ranks, seed):
    def rank_main(comm):
        x = rank_data(seed, comm.rank, 1, "float32", (1001,))
        reduced = cc.all_reduce(x, "sum", comm=comm)
        gathered = comm.all_gather(x, tiled=False)
        return reduced, gathered

    results = thread_ranks(3, rank_main)
    xs = [rank_data(seed, r, 1, "float32", (1001,)) for r in range(3)]
    for reduced, gathered in results:
        assert difference(reduced, reference_reduce(xs, "sum")) is None
        assert np.array_equal(gathered, np.stack(xs))


def test_torch_tensors_including_bfloat16(thread_ranks, seed):
    torch = pytest.importorskip("torch")

    def rank_main(comm):
        out = []
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            x = torch.from_numpy(rank_data(seed, comm.rank, 2, "float32", (4, 6))).to(dtype)
            reduced = cc.all_reduce(x, "sum", comm=comm)
            gathered = cc.all_gather(x, axis=1, comm=comm)
            scattered = cc.reduce_scatter(x, "max", axis=1, comm=comm)
            in_place = x.clone()
            cc.all_reduce(in_place, "max", comm=comm, out=in_place)
            out.append((reduced, gathered, scattered, in_place))
        return out

    nranks = 2
    results = thread_ranks(nranks, rank_main)
    xs = [torch.from_numpy(rank_data(seed, r, 2, "float32", (4, 6))) for r in range(nranks)]
    for rank, per_dtype in enumerate(results):
        for dtype, (reduced, gathered, scattered, in_place) in zip(
                (torch.bfloat16, torch.float16, torch.float32), per_dtype):
            inputs = [x.to(dtype) for x in xs]
            assert type(reduced) is torch.Tensor and reduced.dtype == dtype
            expected = sum(x.float() for x in inputs).to(dtype)
            torch.testing.assert_close(reduced, expected)
            assert torch.equal(gathered, torch.cat(inputs, dim=1))
            maximum = torch.maximum(inputs[0], inputs[1])
            assert torch.equal(scattered, maximum[:, 3 * rank:3 * rank + 3])
            assert torch.equal(in_place, maximum)
