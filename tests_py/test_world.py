"""The world communicator, sub-communicators, the store and the package."""

import importlib.metadata
import os
import secrets

import numpy as np
import pytest

import concord as cc
from concord import _capi
from concord.errors import ConcordError, InvalidArgumentError


def test_version_and_build_info():
    assert cc.__version__ == importlib.metadata.version("concord")
    info = cc.build_info()
    assert info["version"] == cc.__version__
    assert "shm" in info["backends"]


def test_world_of_one():
    assert not cc.is_initialized()
    comm = cc.init(timeout=12.5)
    assert cc.is_initialized() and cc.world() is comm
    assert (cc.rank(), cc.world_size(), cc.local_rank()) == (0, 1, 0)
    assert (comm.rank, comm.size, comm.local_rank) == (0, 1, 0)
    assert comm.backend == "shm"
    assert comm.timeout == 12.5
    assert repr(comm) == "Communicator(rank=0, size=1, backend='shm')"
    cc.barrier()
    cc.shutdown()
    assert not cc.is_initialized() and comm.closed
    assert repr(comm) == "Communicator(closed)"
    cc.shutdown()  # a second shutdown does nothing


def test_init_again_after_shutdown():
    for _ in range(3):
        cc.init()
        assert np.array_equal(cc.all_reduce(np.arange(3)), np.arange(3))
        cc.shutdown()


def test_init_twice():
    cc.init()
    with pytest.raises(ConcordError) as info:
        cc.init()
    assert str(info.value) == "concord is already initialised: call concord.shutdown() first"


def test_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("CONCORD_TIMEOUT", "7")
    assert cc.init().timeout == 7.0


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan")])
def test_timeout_must_be_positive(timeout):
    with pytest.raises(InvalidArgumentError, match="timeout must be positive"):
        cc.init(timeout=timeout)
    assert not cc.is_initialized()


def test_explicit_arguments_outside_the_world():
    with pytest.raises(InvalidArgumentError):
        cc.init(rank=3, world_size=2)
    assert not cc.is_initialized()


@pytest.mark.parametrize("argument", ["rank", "world_size"])
def test_negative_rank_or_world_size(argument):
    # C reads -1 as "from the environment": a negative number given here
    # must not be taken for that.
    for value in (-1, -3):
        with pytest.raises(InvalidArgumentError) as info:
            cc.init(**{argument: value})
        assert str(info.value) == f"{argument} must be >= 0, got {value}"
    assert not cc.is_initialized()


def test_infinite_timeout():
    comm = cc.init(timeout=float("inf"))
    assert comm.timeout == float("inf")
    assert cc.all_reduce(np.arange(3)).tolist() == [0, 1, 2]


def test_context_manager_closes():
    with cc.init() as comm:
        assert not comm.closed
    assert comm.closed and not cc.is_initialized()


# ---- several ranks ---------------------------------------------------------------


def _world_facts(explicit):
    if explicit:
        # The launcher serves concord's store on CONCORD_MASTER_PORT
        # (MASTER_PORT is left to torch.distributed).
        comm = cc.init(rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                       master_addr=os.environ["CONCORD_MASTER_ADDR"],
                       master_port=int(os.environ["CONCORD_MASTER_PORT"]), timeout=60.0)
    else:
        comm = cc.init(timeout=60.0)
    facts = {"rank": cc.rank(), "size": cc.world_size(), "local_rank": cc.local_rank(),
             "backend": comm.backend, "timeout": comm.timeout}
    facts["ranks"] = cc.all_gather(np.array([comm.rank])).tolist()
    cc.barrier()
    cc.shutdown()
    return facts


@pytest.mark.parametrize("explicit", [False, True], ids=["environment", "arguments"])
def test_world_of_three(explicit):
    facts = cc.launch(_world_facts, 3, explicit)
    for rank, fact in enumerate(facts):
        assert fact == {"rank": rank, "size": 3, "local_rank": rank, "backend": "shm",
                        "timeout": 60.0, "ranks": [0, 1, 2]}


def _split_and_reduce():
    world = cc.init(timeout=60.0)
    rank = world.rank
    # Odd and even ranks, each group in reverse rank order; rank 4 joins none.
    color = None if rank == 4 else rank % 2
    sub = world.split(color, key=-rank)
    if sub is None:
        outcome = None
    else:
        with sub:
            reduced = cc.all_reduce(np.array([rank], np.int64), comm=sub).tolist()
            gathered = sub.all_gather(np.array([rank]), async_op=True).wait().tolist()
            outcome = (sub.rank, sub.size, reduced, gathered)
    # The world still works after the split.
    total = cc.all_reduce(np.array([1])).tolist()
    cc.shutdown()
    return outcome, total


def test_split():
    results = cc.launch(_split_and_reduce, 5)
    evens, odds = [2, 0], [3, 1]  # in key order: descending rank
    for rank, (outcome, total) in enumerate(results):
        assert total == [5]
        if rank == 4:
            assert outcome is None
            continue
        members = evens if rank % 2 == 0 else odds
        assert outcome == (members.index(rank), 2, [sum(members)], members)


def _init_in_child():
    cc.init(timeout=60.0)
    return cc.all_reduce(np.array([cc.rank()])).tolist()


def test_forked_ranks_start_without_the_parents_world():
    parent = cc.init()
    assert cc.launch(_init_in_child, 2) == [[1], [1]]
    # The parent's world is untouched by its children.
    assert cc.world() is parent
    assert cc.all_reduce(np.array([5])).tolist() == [5]


def test_communicators_as_threads(thread_ranks):
    def rank_main(comm):
        cc.barrier(comm=comm)
        return comm.rank, comm.size, cc.all_reduce(np.array([comm.rank + 1]), comm=comm).tolist()

    assert thread_ranks(4, rank_main) == [(r, 4, [10]) for r in range(4)]


# ---- the store ----------------------------------------------------------------------


def test_store_round_trip():
    token = secrets.token_hex(8)
    with _capi.StoreServer("127.0.0.1", 0, token) as server:
        assert server.port > 0
        with _capi.Store("127.0.0.1", server.port, token, 5.0) as a, \
                _capi.Store("127.0.0.1", server.port, token, 5.0) as b:
            a.set("small", b"hello")
            assert b.get("small") == b"hello"
            a.set("empty", b"")
            assert b.get("empty") == b""
            large = os.urandom(1 << 20)  # beyond the first read's buffer
            a.set("large", bytearray(large))
            assert b.get("large") == large
            b.wait(["small", "large"])
            assert [a.add("counter", 2), b.add("counter", -5)] == [2, -3]
            assert a.delete("small") and not a.delete("small")
            assert a.timeout == 5.0
