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


def test_gloo_is_unavailable_in_this_build():
    with pytest.raises(cc.UnavailableError, match="backend 'gloo' is not in this build"):
        cc.init("gloo", rank=0, world_size=1)
    assert not cc.is_initialized()


def test_nccl_without_a_gpu_fails_at_init():
    # It used to be accepted and give a communicator whose backend was "shm".
    if _cuda_usable():
        pytest.skip("this machine can use NCCL")
    with pytest.raises(cc.UnavailableError, match="^backend 'nccl': "):
        cc.init("nccl", rank=0, world_size=1)
    assert not cc.is_initialized()
