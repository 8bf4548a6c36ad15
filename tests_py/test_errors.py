"""Each error path sees its exact exception, and leaves the caller's input
untouched."""

import json
import os
import pickle
import secrets
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import concord as cc
from concord import _capi
from concord.errors import (
    AbortedError,
    CollectiveTimeoutError,
    ConcordError,
    InvalidArgumentError,
    MismatchError,
    RemoteError,
    Status,
    UnavailableError,
)


def _raises_untouched(exception, message, call, *arrays):
    """Asserts call() raises exactly `exception` with `message` (a string
    for equality, or a list of substrings) and that `arrays` did not change."""
    copies = [np.array(a, copy=True) for a in arrays]
    with pytest.raises(exception) as info:
        call()
    assert type(info.value) is exception
    text = str(info.value)
    if isinstance(message, str):
        assert text == message
    else:
        for part in message:
            assert part in text, text
    for array, copy in zip(arrays, copies):
        assert np.array_equal(array, copy)
    return info.value


def test_collective_before_init():
    x = np.ones(4)
    for call in (lambda: cc.all_reduce(x), lambda: cc.barrier(), lambda: cc.world(),
                 lambda: cc.rank()):
        _raises_untouched(ConcordError, "concord is not initialised: call concord.init() first",
                          call, x)
    assert not cc.is_initialized()


def test_unknown_op(world1):
    x = np.arange(4.0)
    message = "unknown op 'avg'; valid ops: sum, mean, max, min, prod"
    error = _raises_untouched(InvalidArgumentError, message, lambda: cc.all_reduce(x, "avg"), x)
    assert isinstance(error, ValueError) and error.status == Status.INVALID_ARGUMENT
    _raises_untouched(InvalidArgumentError, message,
                      lambda: cc.reduce_scatter(x, "avg", out=x[:4].copy()), x)
    _raises_untouched(InvalidArgumentError, "unknown op 'SUM'; valid ops: sum, mean, max, min, prod",
                      lambda: cc.all_reduce(x, "SUM"), x)


def test_unsupported_dtype(world1):
    x = np.ones(4, np.complex64)
    _raises_untouched(InvalidArgumentError, ["unsupported dtype"], lambda: cc.all_reduce(x), x)
    y = np.array(["a", "b"])
    _raises_untouched(InvalidArgumentError, "x has dtype <U1, which has no DLPack equivalent",
                      lambda: cc.all_gather(y), y)


def test_bool_only_reduces_with_max_and_min(world1):
    x = np.array([True, False])
    for op in ("sum", "prod", "mean"):
        _raises_untouched(InvalidArgumentError, [op], lambda: cc.all_reduce(x, op), x)


def test_non_contiguous_input(world1):
    base = np.arange(10.0)
    _raises_untouched(InvalidArgumentError, ["not contiguous"],
                      lambda: cc.all_reduce(base[::2]), base)
    _raises_untouched(InvalidArgumentError, ["not contiguous"],
                      lambda: cc.all_gather(base.reshape(2, 5).T), base)


def test_out_with_the_wrong_shape(world1):
    x, out = np.arange(4.0), np.zeros(3)
    _raises_untouched(InvalidArgumentError, "out has shape (3,), expected (4,)",
                      lambda: cc.all_reduce(x, out=out), x, out)
    _raises_untouched(InvalidArgumentError, "out has shape (3,), expected (4,)",
                      lambda: cc.all_gather(x, out=out), x, out)
    _raises_untouched(InvalidArgumentError, "out has shape (3,), expected (1, 4)",
                      lambda: cc.all_gather(x, tiled=False, out=out), x, out)


def test_out_with_the_wrong_dtype(world1):
    x, out = np.arange(4.0), np.zeros(4, np.float32)
    _raises_untouched(InvalidArgumentError, "out has dtype float32, expected float64",
                      lambda: cc.all_reduce(x, out=out), x, out)
    _raises_untouched(InvalidArgumentError, "out has dtype float32, expected float64",
                      lambda: cc.broadcast(x, out=out), x, out)


def test_read_only_out(world1):
    x, out = np.arange(4.0), np.zeros(4)
    out.flags.writeable = False
    _raises_untouched(InvalidArgumentError, "out is read-only",
                      lambda: cc.all_reduce(x, out=out), x, out)
    x.flags.writeable = False
    _raises_untouched(InvalidArgumentError, "out is read-only",
                      lambda: cc.all_reduce(x, out=x), x)
    gathered = np.zeros((4, 1))
    gathered.flags.writeable = False
    _raises_untouched(InvalidArgumentError, "out is read-only",
                      lambda: cc.all_gather(x, axis=1, tiled=False, out=gathered), x, gathered)
    # A read-only input is fine when the result goes elsewhere.
    assert np.array_equal(cc.all_reduce(x), x)


def test_read_only_out_through_dlpack(world1):
    class Subclass(np.ndarray):
        pass

    x = np.arange(4.0)
    out = np.zeros(4).view(Subclass)
    out.flags.writeable = False
    _raises_untouched(InvalidArgumentError, "out is read-only",
                      lambda: cc.all_reduce(x, out=out), x, out)


def test_out_of_another_array_type(world1):
    torch = pytest.importorskip("torch")
    x, out = np.arange(4.0), torch.zeros(4, dtype=torch.float64)
    _raises_untouched(InvalidArgumentError, ["out must be of x's array type"],
                      lambda: cc.all_reduce(x, out=out), x)


def test_mixed_devices(world1):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    x = torch.arange(4.0, device="cuda")
    out = torch.zeros(4)
    with pytest.raises(InvalidArgumentError) as info:
        cc.all_reduce(x, out=out)
    assert str(info.value) == "x is on cuda:0 but out is on cpu; both must be on the same device"
    assert torch.equal(x.cpu(), torch.arange(4.0))


def test_root_out_of_range(world1):
    x = np.arange(3.0)
    for root in (1, -1):
        _raises_untouched(InvalidArgumentError, f"broadcast: root {root} is outside [0, 1)",
                          lambda: cc.broadcast(x, root), x)


@pytest.mark.parametrize("root", [0.0, "0", None, 2**40])
def test_root_not_a_c_int(world1, root):
    x = np.arange(3.0)
    _raises_untouched(InvalidArgumentError,
                      f"broadcast: root must be an integer within a C int's range, got {root!r}",
                      lambda: cc.broadcast(x, root), x)


def test_axis_errors(world1):
    x = np.arange(6.0).reshape(2, 3)
    _raises_untouched(InvalidArgumentError, "all_gather: axis 2 is out of range for 2 dimensions",
                      lambda: cc.all_gather(x, axis=2), x)
    _raises_untouched(InvalidArgumentError,
                      "all_gather: a 0-d x cannot be concatenated; use tiled=False to stack it",
                      lambda: cc.all_gather(np.float64(1.0)))
    _raises_untouched(InvalidArgumentError, "reduce_scatter: x must have at least one dimension",
                      lambda: cc.reduce_scatter(np.float64(1.0)))


def test_reduce_scatter_size_not_divisible(thread_ranks):
    def rank_main(comm):
        x = np.arange(10.0).reshape(2, 5)
        error = _raises_untouched(
            InvalidArgumentError,
            "reduce_scatter: x.shape[1] = 5 is not divisible by the communicator size 2",
            lambda: cc.reduce_scatter(x, axis=1, comm=comm), x)
        # Nothing was communicated: the communicator is still in step.
        return error, cc.all_reduce(np.ones(2), comm=comm).tolist()

    for _, reduced in thread_ranks(2, rank_main):
        assert reduced == [2.0, 2.0]


def test_closed_communicator(world1):
    world1.close()
    _raises_untouched(ConcordError, "concord is not initialised: call concord.init() first",
                      lambda: cc.world())
    with pytest.raises(ConcordError, match="^the communicator is closed$"):
        world1.all_reduce(np.ones(2))


# ---- ranks that disagree ------------------------------------------------------

# Each case: what rank 0 calls, what rank 1 calls (same byte and element
# counts, so only the comparison of what was called can tell them apart),
# and how the error names rank 1's call.
_MISMATCHES = {
    "all_gather dtype": (lambda c: cc.all_gather(np.zeros(4, np.float32), comm=c),
                         lambda c: cc.all_gather(np.zeros(4, np.int32), comm=c),
                         "rank 1 called all_gather #0 (int32 shape (4,))"),
    "broadcast dtype": (lambda c: cc.broadcast(np.zeros(4, np.float32), comm=c),
                        lambda c: cc.broadcast(np.zeros(4, np.int32), comm=c),
                        "rank 1 called broadcast #0 (int32 shape (4,), root 0)"),
    "all_reduce shape": (lambda c: cc.all_reduce(np.zeros((2, 3), np.float32), comm=c),
                         lambda c: cc.all_reduce(np.zeros((3, 2), np.float32), comm=c),
                         "rank 1 called all_reduce #0 (float32 shape (3, 2), sum)"),
    "all_reduce op": (lambda c: cc.all_reduce(np.zeros(3), comm=c),
                      lambda c: cc.all_reduce(np.zeros(3), "max", comm=c),
                      "rank 1 called all_reduce #0 (float64 shape (3,), max)"),
    "broadcast root": (lambda c: cc.broadcast(np.zeros(3), 0, comm=c),
                       lambda c: cc.broadcast(np.zeros(3), 1, comm=c),
                       "rank 1 called broadcast #0 (float64 shape (3,), root 1)"),
    "operation": (lambda c: cc.all_reduce(np.zeros(4), comm=c),
                  lambda c: cc.all_gather(np.zeros(2), comm=c),
                  "rank 1 called all_gather #0"),
}


@pytest.mark.parametrize("case", list(_MISMATCHES))
def test_ranks_that_disagree_get_mismatch_error(thread_ranks, case):
    first, other, rank1_called = _MISMATCHES[case]

    def rank_main(comm):
        with pytest.raises(MismatchError) as info:
            (first if comm.rank == 0 else other)(comm)
        return str(info.value)

    for message in thread_ranks(2, rank_main):
        assert rank1_called in message, message


# ---- a peer that dies -------------------------------------------------------

_PEER_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import concord as cc

    cc.init(timeout=float(sys.argv[2]))
    x = np.ones(1000, np.float32)
    cc.all_reduce(x)
    if cc.rank() == int(sys.argv[1]):
        os._exit(3)
    start = time.monotonic()
    try:
        if sys.argv[3] == "async":
            cc.all_reduce(x, async_op=True).wait()
        else:
            cc.all_reduce(x)
        outcome = {"error": None}
    except cc.ConcordError as exc:
        outcome = {"error": type(exc).__name__, "message": str(exc)}
    outcome["elapsed"] = time.monotonic() - start
    print(json.dumps(outcome))
""")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_peer_dying_mid_collective(tmp_path, mode):
    nranks, dying, timeout = 3, 1, 5.0
    token = secrets.token_hex(8)
    script = tmp_path / "peer.py"
    script.write_text(_PEER_SCRIPT)
    with _capi.StoreServer("127.0.0.1", 0, token) as server:
        ranks = []
        for rank in range(nranks):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nranks),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port),
                       CONCORD_JOB_TOKEN=token, CONCORD_STORE_SERVER="launcher")
            ranks.append(subprocess.Popen(
                [sys.executable, str(script), str(dying), str(timeout), mode],
                env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [rank.communicate(timeout=60) for rank in ranks]
    assert ranks[dying].returncode == 3
    for rank in range(nranks):
        if rank == dying:
            continue
        stdout, stderr = outputs[rank]
        assert ranks[rank].returncode == 0, stderr
        outcome = json.loads(stdout)
        assert outcome["error"] in ("RemoteError", "CollectiveTimeoutError"), outcome
        assert "all_reduce" in outcome["message"], outcome
        assert outcome["elapsed"] < timeout + 2.0, outcome


# ---- the store -----------------------------------------------------------------


def test_store_refuses_a_wrong_token():
    with _capi.StoreServer("127.0.0.1", 0, "the-right-token") as server:
        with pytest.raises(InvalidArgumentError) as info:
            _capi.Store("127.0.0.1", server.port, "a-wrong-token", 5.0)
        assert type(info.value) is InvalidArgumentError
        assert "wrong job token" in str(info.value)


def test_store_refuses_an_oversized_value():
    cap = 64 << 20
    with _capi.StoreServer("127.0.0.1", 0, "token") as server:
        with _capi.Store("127.0.0.1", server.port, "token", 5.0) as store:
            with pytest.raises(InvalidArgumentError) as info:
                store.set("big", bytes(cap + 1))
    assert type(info.value) is InvalidArgumentError
    assert f"{cap + 1} bytes; the cap is {cap}" in str(info.value)


def test_store_get_times_out():
    with _capi.StoreServer("127.0.0.1", 0, "token") as server:
        with _capi.Store("127.0.0.1", server.port, "token", 5.0) as store:
            start = time.monotonic()
            with pytest.raises(CollectiveTimeoutError) as info:
                store.get("never-set", timeout=0.3)
            assert time.monotonic() - start < 3.0
            assert "never-set" in str(info.value)


# ---- the classes --------------------------------------------------------------

_CLASSES = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.UNAVAILABLE: UnavailableError,
    Status.TIMEOUT: CollectiveTimeoutError,
    Status.REMOTE: RemoteError,
    Status.MISMATCH: MismatchError,
    Status.ABORTED: AbortedError,
    Status.OUT_OF_MEMORY: ConcordError,
    Status.INTERNAL: ConcordError,
}


@pytest.mark.parametrize("status", list(_CLASSES), ids=lambda s: s.name)
def test_each_status_raises_its_class(status):
    with pytest.raises(ConcordError) as info:
        _capi.check_status(status)
    assert type(info.value) is _CLASSES[status]
    assert info.value.status == status
    assert isinstance(info.value, RuntimeError)
    assert str(info.value)


def test_interrupted_raises_what_interrupted_it():
    # Without a signal handler's exception at hand, an interrupted call
    # raises KeyboardInterrupt, as Ctrl-C does.
    with pytest.raises(KeyboardInterrupt):
        _capi.check_status(Status.INTERRUPTED)


def test_ok_raises_nothing():
    assert _capi.check_status(Status.OK) == 0


def test_python_bases():
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(CollectiveTimeoutError, TimeoutError)
    for cls in set(_CLASSES.values()):
        assert issubclass(cls, ConcordError) and issubclass(cls, RuntimeError)


@pytest.mark.parametrize("cls", [ConcordError, *sorted(set(_CLASSES.values()) - {ConcordError},
                                                       key=lambda c: c.__name__)])
def test_errors_pickle(cls):
    error = cls("all_reduce #3 failed: rank 2 died")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.status == error.status
    raised = cls("with an explicit status", Status.INTERNAL)
    assert pickle.loads(pickle.dumps(raised)).status == Status.INTERNAL
