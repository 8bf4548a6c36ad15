"""init(backend=...) is honoured end to end: the communicator uses the named
backend, and an unknown or unusable one is a clear error at init."""

import numpy as np
import pytest

import concord as cc


def _cuda_usable():
    info = cc.build_info()
    return info["cuda"]["available"] and info["nccl"]["available"]


@pytest.mark.parametrize("backend", ["auto", "shm"])
def test_cpu_backends_give_shm(backend):
    comm = cc.init(backend, rank=0, world_size=1, timeout=30.0)
    assert comm.backend == "shm"
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(cc.all_reduce(x), x)


def test_unknown_backend_is_an_invalid_argument():
    with pytest.raises(cc.InvalidArgumentError,
                       match=r"^unknown backend 'mpi'; choose 'auto', 'shm', 'gloo' or 'nccl'$"):
        cc.init("mpi", rank=0, world_size=1)
    assert not cc.is_initialized()


def test_gloo_is_in_this_build():
    assert cc.build_info()["backends"]["gloo"] is True


def _gloo_all_reduce(seed, op):
    """Each rank's share of a forced-gloo all_reduce over several dtypes and
    sizes, against NumPy's reduction of every rank's inputs."""
    comm = cc.init("gloo", timeout=60.0)
    failures = []
    try:
        assert comm.backend == "gloo", comm.backend
        for dtype in ("float32", "float64", "int32", "int64"):
            for n in (0, 1, 7, 1000003):
                inputs = [np.random.default_rng([seed, q, n]).integers(-3, 4, n).astype(dtype)
                          for q in range(cc.world_size())]
                expected = getattr(np, op)(np.stack(inputs), axis=0)
                got = cc.all_reduce(inputs[cc.rank()], op=op)
                if got.dtype != np.dtype(dtype) or not np.array_equal(got, expected):
                    failures.append(f"{dtype} n={n}")
    finally:
        cc.shutdown()
    return failures


@pytest.mark.parametrize("nprocs", [2, 3])
def test_gloo_forced_on_one_host_matches_numpy(process_ranks, seed, nprocs):
    for failures in process_ranks(nprocs, _gloo_all_reduce, seed, "sum"):
        assert failures == []


def test_nccl_without_a_gpu_fails_at_init():
    # It used to be accepted and give a communicator whose backend was "shm".
    if _cuda_usable():
        pytest.skip("this machine can use NCCL")
    with pytest.raises(cc.UnavailableError, match="^backend 'nccl': "):
        cc.init("nccl", rank=0, world_size=1)
    assert not cc.is_initialized()
