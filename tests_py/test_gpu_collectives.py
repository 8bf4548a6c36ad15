"""Collectives on CUDA torch tensors against NumPy references.

A world of one in this process: every collective over every dtype and op,
sizes 0, 1, 7 and 1000003, in place, into out= and asynchronously, issued
on the default stream and on a non-default one. Two ranks sharing the one
GPU (fresh processes under concord-run; NCCL is told they are on different
hosts, so it accepts two ranks on one device): the collectives, split
sub-communicators and a mesh axis. Every rank generates every rank's data
from (seed, rank, case), so each computes the reference itself.

On CUDA a collective is ordered on the caller's current stream: it runs
after the work already queued there, and work queued there afterwards sees
its result. The stream checks write the input late (after a sleep kernel)
on the stream and read the result back on the same stream, with no other
synchronisation than that stream's.
"""

import os
import shutil
import subprocess

import numpy as np
import pytest

import concord as cc
from helpers import (
    FLOATS,
    SLEEP_CYCLES,
    RankChecks,
    delay,
    host,
    ops_for,
    rank_data,
    report,
    wide_reference,
)

pytestmark = pytest.mark.gpu

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool"]
LARGE = 1000003
SIZES = [0, 1, 7, LARGE]
TOLERANCE = {"float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2), "float32": (1e-6, 1e-6),
             "float64": (1e-12, 1e-12)}


def to_torch(torch, array, dtype):
    """A CPU tensor of `dtype` holding `array` (rounded when narrower)."""
    return torch.from_numpy(np.array(array, order="C")).to(getattr(torch, dtype))


def reference_reduce(torch, tensors, op):
    """op over CPU tensors as concord defines it, in their dtype."""
    dtype = str(tensors[0].dtype).removeprefix("torch.")
    return to_torch(torch, wide_reference([host(t) for t in tensors], op, dtype), dtype)


def difference(torch, result, expected, device):
    """What is wrong with a CUDA result, or None."""
    if type(result) is not torch.Tensor:
        return f"result is a {type(result).__name__}, expected a torch.Tensor"
    if result.device != device:
        return f"result is on {result.device}, expected {device}"
    if result.dtype != expected.dtype or tuple(result.shape) != tuple(expected.shape):
        return (f"result is {result.dtype}{list(result.shape)}, "
                f"expected {expected.dtype}{list(expected.shape)}")
    got = result.detach().cpu()
    name = str(expected.dtype).removeprefix("torch.")
    if name in FLOATS:
        rtol, atol = TOLERANCE[name]
        equal = torch.isclose(got.double(), expected.double(), rtol=rtol, atol=atol)
    else:
        equal = got == expected
    if bool(equal.all()):
        return None
    bad = (~equal).nonzero()
    first = tuple(int(i) for i in bad[0])
    return (f"{bad.shape[0]} elements differ, first at {first}: "
            f"{got[first].item()!r} != {expected[first].item()!r}")


class Checks(RankChecks):
    """The checks of one rank of the world, on CUDA torch tensors."""

    def __init__(self, torch, seed, device=None):
        super().__init__(seed, cc.rank(), cc.world_size())
        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None \
            else device

    # ---- data and expectations

    def data(self, dtype, shape, op="sum"):
        """Every rank's data (CPU tensors) for a new case; this rank's is
        [self.rank]."""
        self.case += 1
        return [to_torch(self.torch, rank_data(self.seed, r, self.case, dtype, shape, op), dtype)
                for r in range(self.size)]

    def mine(self, xs):
        """This rank's tensor of a case, on the GPU."""
        return xs[self.rank].to(self.device, copy=True)

    def difference(self, result, expected):
        return difference(self.torch, result, expected, self.device)

    def expect_untouched(self, label, x, copy):
        if not self.torch.equal(x.cpu(), copy):
            self.fail(label, "the input changed")

    def expect_raises(self, label, exc_type, fn):
        try:
            fn()
        except exc_type:
            return
        except Exception as exc:
            self.fail(label, f"raised {type(exc).__name__}: {exc}, expected {exc_type.__name__}")
            return
        self.fail(label, f"did not raise {exc_type.__name__}")

    # ---- all_reduce

    def all_reduce(self, dtype, shape, *, variants=True, comm=None):
        torch = self.torch
        for op in ops_for(dtype):
            label = f"all_reduce {op} {dtype} {shape}"
            xs = self.data(dtype, shape, op)
            x = self.mine(xs)
            copy = xs[self.rank].clone()
            self.expect(label, cc.all_reduce(x, op, comm=comm), reference_reduce(torch, xs, op))
            self.expect_untouched(label, x, copy)

            xs = self.data(dtype, shape, op)
            y = self.mine(xs)
            result = cc.all_reduce(y, op, comm=comm, out=y)
            self.expect_true(f"{label} in place: result is not out", result is y)
            self.expect(f"{label} in place", y, reference_reduce(torch, xs, op))
        if not variants:
            return
        op = ops_for(dtype)[0]
        label = f"all_reduce {op} {dtype} {shape}"
        xs = self.data(dtype, shape, op)
        out = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
        result = cc.all_reduce(self.mine(xs), op, comm=comm, out=out)
        self.expect_true(f"{label} out=: result is not out", result is out)
        self.expect(f"{label} out=", out, reference_reduce(torch, xs, op))

        cases = [(op, self.data(dtype, shape, op)) for op in ops_for(dtype)]
        works = [cc.all_reduce(self.mine(xs), op, comm=comm, async_op=True) for op, xs in cases]
        for (op, xs), work in zip(cases, works):
            label = f"all_reduce {op} {dtype} {shape} async"
            self.expect(label, work.wait(), reference_reduce(torch, xs, op))
            self.expect_true(f"{label}: not done after wait()", work.done())

    # ---- all_gather

    def all_gather(self, dtype, shape, *, variants=True, comm=None):
        torch = self.torch
        label = f"all_gather {dtype} {shape}"
        xs = self.data(dtype, shape)
        x = self.mine(xs)
        copy = xs[self.rank].clone()
        self.expect(f"{label} tiled", cc.all_gather(x, comm=comm), torch.cat(xs))
        self.expect(f"{label} stacked", cc.all_gather(x, tiled=False, comm=comm), torch.stack(xs))
        self.expect_untouched(label, x, copy)
        if not variants:
            return
        xs = self.data(dtype, shape)
        out = torch.empty((self.size * shape[0], *shape[1:]), dtype=getattr(torch, dtype),
                          device=self.device)
        result = cc.all_gather(self.mine(xs), out=out, comm=comm)
        self.expect_true(f"{label} out=: result is not out", result is out)
        self.expect(f"{label} out=", out, torch.cat(xs))

        xs = self.data(dtype, shape)
        work = cc.all_gather(self.mine(xs), tiled=False, async_op=True, comm=comm)
        self.expect(f"{label} async", work.wait(), torch.stack(xs))

    def all_gather_axes(self, dtype):
        torch = self.torch
        shape = (2, 5, 3)
        label = f"all_gather {dtype} {shape}"
        xs = self.data(dtype, shape)
        x = self.mine(xs)
        self.expect(f"{label} axis=1", cc.all_gather(x, axis=1), torch.cat(xs, dim=1))
        self.expect(f"{label} stacked axis=-1", cc.all_gather(x, axis=-1, tiled=False),
                    torch.stack(xs, dim=-1))
        self.expect(f"{label} 0-d stacked", cc.all_gather(x[0, 0, 0], tiled=False),
                    torch.stack([a[0, 0, 0] for a in xs]))
        xs = self.data(dtype, shape)
        out = torch.empty((2, 5, 3 * self.size), dtype=getattr(torch, dtype), device=self.device)
        result = cc.all_gather(self.mine(xs), axis=2, out=out)
        self.expect_true(f"{label} axis=2 out=: result is not out", result is out)
        self.expect(f"{label} axis=2 out=", out, torch.cat(xs, dim=2))

    # ---- reduce_scatter

    def reduce_scatter(self, dtype, block, *, variants=True, comm=None):
        torch = self.torch
        shape = (self.size * block,)
        mine = slice(self.rank * block, (self.rank + 1) * block)
        for op in ops_for(dtype):
            label = f"reduce_scatter {op} {dtype} {shape}"
            xs = self.data(dtype, shape, op)
            x = self.mine(xs)
            copy = xs[self.rank].clone()
            self.expect(label, cc.reduce_scatter(x, op, comm=comm),
                        reference_reduce(torch, xs, op)[mine])
            self.expect_untouched(label, x, copy)
        if not variants:
            return
        op = ops_for(dtype)[0]
        label = f"reduce_scatter {op} {dtype} {shape}"
        xs = self.data(dtype, shape, op)
        out = torch.empty((block,), dtype=getattr(torch, dtype), device=self.device)
        result = cc.reduce_scatter(self.mine(xs), op, out=out, comm=comm)
        self.expect_true(f"{label} out=: result is not out", result is out)
        self.expect(f"{label} out=", out, reference_reduce(torch, xs, op)[mine])

        xs = self.data(dtype, shape, op)
        work = cc.reduce_scatter(self.mine(xs), op, async_op=True, comm=comm)
        self.expect(f"{label} async", work.wait(), reference_reduce(torch, xs, op)[mine])

    def reduce_scatter_axis(self, dtype):
        shape = (3, 2 * self.size, 2)
        mine = (slice(None), slice(2 * self.rank, 2 * self.rank + 2))
        op = ops_for(dtype)[0]
        xs = self.data(dtype, shape, op)
        self.expect(f"reduce_scatter {op} {dtype} {shape} axis=1",
                    cc.reduce_scatter(self.mine(xs), op, axis=1),
                    reference_reduce(self.torch, xs, op)[mine])

    # ---- broadcast

    def broadcast(self, dtype, shape, roots, *, variants=True, comm=None):
        torch = self.torch
        for root in roots:
            label = f"broadcast root={root} {dtype} {shape}"
            xs = self.data(dtype, shape)
            x = self.mine(xs) if self.rank == root else torch.zeros_like(self.mine(xs))
            copy = x.cpu()
            self.expect(label, cc.broadcast(x, root, comm=comm), xs[root])
            self.expect_untouched(label, x, copy)

            xs = self.data(dtype, shape)
            y = self.mine(xs) if self.rank == root else torch.zeros_like(self.mine(xs))
            result = cc.broadcast(y, root, out=y, comm=comm)
            self.expect_true(f"{label} in place: result is not out", result is y)
            self.expect(f"{label} in place", y, xs[root])
            if not variants:
                continue
            xs = self.data(dtype, shape)
            out = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            result = cc.broadcast(self.mine(xs), root, out=out, comm=comm)
            self.expect_true(f"{label} out=: result is not out", result is out)
            self.expect(f"{label} out=", out, xs[root])

            xs = self.data(dtype, shape)
            work = cc.broadcast(self.mine(xs), root, async_op=True, comm=comm)
            self.expect(f"{label} async", work.wait(), xs[root])

    # ---- stream ordering

    def late_input(self, xs, stream):
        """This rank's tensor, written on `stream` after a sleep kernel: a
        collective that does not wait for the stream's pending work reads
        zeros (or a partial copy)."""
        torch = self.torch
        src = self.mine(xs)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            x = torch.zeros_like(src)
            delay(torch)
            x.copy_(src)
        # src was allocated on the current stream and is read on `stream`
        # after the sleep: without this, freeing it on return would let the
        # caching allocator hand its memory to the next allocation on the
        # current stream before `stream` has read it.
        src.record_stream(stream)
        return x

    def on_stream(self, dtype, shape, stream, where):
        """Every collective issued on `stream` (a torch.cuda.Stream), its
        input written late on that stream and its result read back on it;
        the results are checked after stream.synchronize() only."""
        torch = self.torch
        op = ops_for(dtype)[0]
        block = shape[0]
        rows = slice(self.rank * block, (self.rank + 1) * block)
        cases = []
        for kind in ("all_reduce", "all_reduce in place", "all_reduce out=", "all_gather",
                     "reduce_scatter", "broadcast", "broadcast in place"):
            full = (self.size * block, *shape[1:]) if kind == "reduce_scatter" else shape
            xs = self.data(dtype, full, op)
            x = self.late_input(xs, stream)
            with torch.cuda.stream(stream):
                if kind == "all_reduce":
                    result = cc.all_reduce(x, op)
                elif kind == "all_reduce in place":
                    result = cc.all_reduce(x, op, out=x)
                elif kind == "all_reduce out=":
                    result = cc.all_reduce(x, op, out=torch.empty_like(x))
                elif kind == "all_gather":
                    result = cc.all_gather(x)
                elif kind == "reduce_scatter":
                    result = cc.reduce_scatter(x, op)
                elif kind == "broadcast":
                    result = cc.broadcast(x, self.size - 1)
                else:
                    result = cc.broadcast(x, self.size - 1, out=x)
                # Read on the stream right away: the stream must wait for
                # the collective's result.
                seen = result.clone()
            expected = {"all_gather": lambda: torch.cat(xs),
                        "reduce_scatter": lambda: reference_reduce(torch, xs, op)[rows],
                        "broadcast": lambda: xs[-1],
                        "broadcast in place": lambda: xs[-1]}.get(
                kind, lambda: reference_reduce(torch, xs, op))()
            cases.append((f"{kind} {op} {dtype} {shape} on the {where} stream", seen, expected))

        xs = self.data(dtype, shape, op)
        x = self.late_input(xs, stream)
        with torch.cuda.stream(stream):
            work = cc.all_reduce(x, op, async_op=True)
        # wait() blocks the host until the collective finished: reading the
        # result on another stream is safe afterwards.
        result = work.wait()
        self.expect(f"all_reduce {op} {dtype} {shape} async on the {where} stream", result,
                    reference_reduce(torch, xs, op))
        stream.synchronize()
        for label, seen, expected in cases:
            self.expect(label, seen, expected)

    # ---- communicators

    def sub_communicators(self, dtype="float32", shape=(1001,)):
        """A split reversing the ranks, singleton splits and a mesh axis."""
        torch = self.torch
        world = cc.world()
        reverse = world.split(0, key=self.size - 1 - self.rank)
        try:
            self.expect_true("reversed split: wrong rank",
                             reverse.rank == self.size - 1 - self.rank
                             and reverse.size == self.size)
            xs = self.data(dtype, shape)
            x = self.mine(xs)
            self.expect("reversed split all_gather", cc.all_gather(x, comm=reverse),
                        torch.cat(xs[::-1]))
            self.expect("reversed split broadcast root=0", cc.broadcast(x, 0, comm=reverse),
                        xs[-1])
            self.expect("reversed split all_reduce sum", cc.all_reduce(x, "sum", comm=reverse),
                        reference_reduce(torch, xs, "sum"))
            self.all_reduce(dtype, (7,), variants=False, comm=reverse)
        finally:
            reverse.close()

        alone = world.split(self.rank)
        try:
            self.expect_true("singleton split: wrong size", alone.size == 1 and alone.rank == 0)
            xs = self.data(dtype, shape)
            self.expect("singleton split all_reduce mean",
                        cc.all_reduce(self.mine(xs), "mean", comm=alone), xs[self.rank])
        finally:
            alone.close()

        mesh = cc.make_mesh((self.size,), ("data",))
        data = mesh.comm("data")
        for op in ("sum", "max"):
            xs = self.data(dtype, shape, op)
            self.expect(f"mesh axis 'data' all_reduce {op}",
                        cc.all_reduce(self.mine(xs), op, comm=data),
                        reference_reduce(torch, xs, op))

    # ---- errors

    def host_out_is_refused(self, only_rank=None):
        """A CUDA input with a host out= raises InvalidArgumentError before
        any communication: on several ranks only `only_rank` makes the bad
        calls, and the collective every rank issues next must still match."""
        torch = self.torch
        x = torch.ones(5, device=self.device)
        if only_rank is None or self.rank == only_rank:
            for out_kind in ("torch CPU", "NumPy"):
                calls = {
                    "all_reduce": (lambda out: cc.all_reduce(x, out=out), 5),
                    "all_gather": (lambda out: cc.all_gather(x, out=out), 5 * self.size),
                    "reduce_scatter": (
                        lambda out: cc.reduce_scatter(x.repeat(self.size), out=out), 5),
                    "broadcast": (lambda out: cc.broadcast(x, out=out), 5),
                }
                for name, (call, n) in calls.items():
                    out = torch.zeros(n) if out_kind == "torch CPU" else np.zeros(n, np.float32)
                    label = f"{name} of a CUDA tensor into a {out_kind} out="
                    self.expect_raises(label, cc.InvalidArgumentError, lambda: call(out))
                    self.expect_true(f"{label}: out was written", not np.asarray(out).any())
        self.expect("all_reduce after the refused calls", cc.all_reduce(x),
                    torch.full((5,), float(self.size)))


# ---- a world of one in this process -------------------------------------------


@pytest.fixture
def checks(torch_cuda, world1, seed):
    return Checks(torch_cuda, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_collective_one_rank(checks, dtype):
    for size in SIZES:
        large = size == LARGE
        checks.all_reduce(dtype, (size,), variants=not large)
        checks.all_gather(dtype, (size,), variants=not large)
        checks.reduce_scatter(dtype, size, variants=not large)
        checks.broadcast(dtype, (size,), [0], variants=not large)
    checks.all_reduce(dtype, ())
    checks.all_reduce(dtype, (3, 5))
    checks.all_gather_axes(dtype)
    checks.reduce_scatter_axis(dtype)
    cc.barrier()
    assert not checks.failures, report(checks.failures, checks.seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["default", "non-default"])
def test_collectives_are_ordered_on_the_current_stream(checks, torch_cuda, dtype, where):
    torch = torch_cuda
    stream = torch.cuda.current_stream() if where == "default" else torch.cuda.Stream()
    for size in SIZES:
        checks.on_stream(dtype, (size,), stream, where)
    assert not checks.failures, report(checks.failures, checks.seed)


def test_collectives_do_not_block_the_host(torch_cuda, world1):
    """Issued behind a long kernel, a collective returns before the kernel
    ends (the stream orders it; the host does not wait)."""
    torch = torch_cuda
    if not hasattr(torch.cuda, "_sleep"):
        pytest.skip("this torch has no torch.cuda._sleep to hold the stream")
    x = torch.ones(1 << 20, device="cuda")
    cc.all_reduce(x, out=x)  # the first CUDA collective sets its communicator up
    torch.cuda.synchronize()
    torch.cuda._sleep(200 * SLEEP_CYCLES)  # about 2 s
    cc.all_reduce(x, out=x)
    returned_early = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert returned_early, "all_reduce waited for the stream's pending work on the host"
    assert bool((x == 1).all())


def test_host_out_for_a_cuda_input_is_refused(checks):
    checks.host_out_is_refused()
    assert not checks.failures, report(checks.failures, checks.seed)


def test_out_of_another_dtype_or_device_is_refused(torch_cuda, world1):
    torch = torch_cuda
    x = torch.ones(5, device="cuda")
    with pytest.raises(cc.InvalidArgumentError):
        cc.all_reduce(x, out=torch.zeros(5, dtype=torch.float64, device="cuda"))
    with pytest.raises(cc.InvalidArgumentError):
        cc.all_reduce(torch.ones(5), out=torch.zeros(5, device="cuda"))
    with pytest.raises(cc.InvalidArgumentError):
        cc.all_reduce(x, out=torch.zeros(6, device="cuda"))


# ---- two ranks sharing the GPU ----------------------------------------------------


def share_the_gpu(rank):
    """Lets the ranks of one job use the same GPU through NCCL; must run
    before the first CUDA collective. NCCL refuses two ranks on one device
    of one host: a distinct NCCL_HOSTID per rank makes them look like
    different hosts (traffic then goes over sockets, on loopback here), and
    newer NCCL versions accept NCCL_MULTI_RANK_GPU_ENABLE=1 instead."""
    os.environ["NCCL_HOSTID"] = f"concord-test-host-{rank}"
    # Ranks on "different hosts" use NCCL's network transport: its socket
    # one, so that no installed network plugin is tried on loopback.
    os.environ.setdefault("NCCL_NET", "Socket")
    os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")


def two_ranks_on_one_gpu(seed):
    """Runs as each rank of a 2-rank concord-run job (see conftest's
    process_ranks); returns this rank's failed checks."""
    share_the_gpu(int(os.environ["RANK"]))
    import torch

    torch.cuda.set_device(0)
    cc.init(timeout=180.0)
    try:
        checks = Checks(torch, seed)
        for dtype in DTYPES:
            for size in (1, 7, LARGE):
                checks.all_reduce(dtype, (size,), variants=size == 7)
            for size in (0, 7, LARGE):
                checks.all_gather(dtype, (size,), variants=size == 7)
                checks.reduce_scatter(dtype, size, variants=size == 7)
            checks.broadcast(dtype, (7,), [0, 1])
            checks.broadcast(dtype, (LARGE,), [1], variants=False)
        checks.all_gather_axes("float32")
        checks.reduce_scatter_axis("int32")
        checks.on_stream("float32", (LARGE,), torch.cuda.Stream(), "non-default")
        checks.on_stream("bfloat16", (7,), torch.cuda.current_stream(), "default")
        checks.sub_communicators()
        checks.host_out_is_refused(only_rank=0)
        cc.barrier()
        torch.cuda.synchronize()
        return checks.failures
    finally:
        cc.shutdown()


def compute_mode(torch):
    """nvidia-smi's compute mode of CUDA device 0 of this process (the GPU
    the ranks share), e.g. "Default" or "Exclusive_Process"; None when it
    cannot tell (no nvidia-smi, or the device not identified)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        listed = subprocess.run([smi, "--query-gpu=uuid,compute_mode", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if listed.returncode != 0:
        return None
    modes = {}
    for line in listed.stdout.splitlines():
        uuid, _, mode = line.partition(",")
        if mode.strip():
            modes[uuid.strip().lower().removeprefix("gpu-")] = mode.strip()
    uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
    if uuid is not None:
        mode = modes.get(str(uuid).lower().removeprefix("gpu-"))
        if mode is not None:
            return mode
    # A MIG instance, or a torch without the UUID: the answer is certain
    # only when every GPU reports the same mode.
    return next(iter(modes.values())) if len(set(modes.values())) == 1 else None


def test_two_ranks_sharing_the_gpu(torch_cuda, process_ranks, seed):
    mode = compute_mode(torch_cuda)
    if mode is not None and mode.lower() == "exclusive_process":
        pytest.skip("two ranks cannot share the GPU: nvidia-smi reports it in "
                    "EXCLUSIVE_PROCESS compute mode (one process at a time)")
    results = process_ranks(2, two_ranks_on_one_gpu, seed, timeout=900.0)
    failures = [failure for rank in results for failure in rank]
    assert not failures, report(failures, seed)
