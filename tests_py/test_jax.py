"""concord.jax: the collectives on JAX arrays, inside jax.jit and outside,
against NumPy on fresh random data over dtypes and shapes; their
derivatives against the analytic ones; ordering, long loops, ranks that
disagree, closed communicators.

The multi-rank checks run as the ranks of one concord-run job of fresh
processes per test (importing JAX and compiling is the cost, so each job
runs many checks); each rank returns the checks that failed. Every rank
generates every rank's data from (seed, rank, case), so each can compute
the reference itself.
"""

import re
import subprocess
import sys

import numpy as np
import pytest

import concord as cc
from helpers import (
    RankChecks,
    array_difference,
    ops_for,
    rank_data,
    reference_reduce,
    report,
)

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import jaxlib.version  # noqa: E402

import concord.jax as cj  # noqa: E402
from concord.jax import _library  # noqa: E402

# The tests of what runs inside jax transformations need the handlers;
# the others run with or without them.
needs_handlers = pytest.mark.skipif(_library.problem() is not None,
                                    reason=f"concord.jax's handlers: {_library.problem()}")

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool"]
SHAPES = [(), (0,), (1,), (7,), (3, 5)]
TOLERANCE = {"float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2), "float32": (1e-5, 1e-6),
             "float64": (1e-12, 1e-12)}


def join_world():
    """The rank side's start: JAX on the CPU with 64-bit types, and the world."""
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_enable_x64", True)
    return cc.init(timeout=120.0)


def numpy_dtype(dtype):
    return np.dtype(jnp.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)


def difference(result, expected):
    """What is wrong with a JAX result, or None."""
    if not isinstance(result, jax.Array):
        return f"result is a {type(result).__name__}, expected a jax.Array"
    return array_difference(np.asarray(result), expected, TOLERANCE)


class Checks(RankChecks):
    """One rank's checks. Cases are collected first, then run all at once
    inside one jitted function per dtype (one compilation each) and, for
    some, one by one outside jit."""

    def __init__(self, seed):
        super().__init__(seed, cc.rank(), cc.world_size())
        self.cases = []  # (label, fn, this rank's input, expected)

    def difference(self, result, expected):
        return difference(result, expected)

    def data(self, dtype, shape, op="sum"):
        """Every rank's NumPy data for a new case; this rank's is [self.rank]."""
        self.case += 1
        return [rank_data(self.seed, r, self.case, dtype, shape, op).astype(numpy_dtype(dtype))
                for r in range(self.size)]

    def add(self, label, fn, xs, expected):
        self.cases.append((label, fn, xs[self.rank], expected))

    # ---- the cases of one dtype

    def all_reduce(self, dtype):
        for op in ops_for(dtype):
            for shape in SHAPES:
                xs = self.data(dtype, shape, op)
                self.add(f"all_reduce {op} {dtype} {shape}",
                         lambda x, op=op: cj.all_reduce(x, op), xs, reference_reduce(xs, op))

    def all_gather(self, dtype):
        for shape in SHAPES[1:]:
            xs = self.data(dtype, shape)
            self.add(f"all_gather {dtype} {shape}", cj.all_gather, xs, np.concatenate(xs))
            xs = self.data(dtype, shape)
            self.add(f"all_gather axis=-1 {dtype} {shape}",
                     lambda x: cj.all_gather(x, axis=-1), xs, np.concatenate(xs, axis=-1))
        for shape, axis in [((), 0), ((7,), 1), ((3, 5), 1)]:
            xs = self.data(dtype, shape)
            self.add(f"all_gather stacked axis={axis} {dtype} {shape}",
                     lambda x, axis=axis: cj.all_gather(x, axis=axis, tiled=False), xs,
                     np.stack(xs, axis=axis))

    def reduce_scatter(self, dtype):
        n = self.size
        for op in ops_for(dtype):
            for shape, axis in [((0,), 0), ((n,), 0), ((7 * n,), 0), ((3, 2 * n), 1),
                                ((2 * n, 3), -2)]:
                xs = self.data(dtype, shape, op)
                blocks = np.split(reference_reduce(xs, op), n, axis=axis)
                self.add(f"reduce_scatter {op} axis={axis} {dtype} {shape}",
                         lambda x, op=op, axis=axis: cj.reduce_scatter(x, op, axis=axis), xs,
                         blocks[self.rank])

    def broadcast(self, dtype):
        for shape in SHAPES:
            root = self.size - 1
            xs = self.data(dtype, shape)
            self.add(f"broadcast root={root} {dtype} {shape}",
                     lambda x, root=root: cj.broadcast(x, root), xs, xs[root])

    # ---- running them

    def run_jitted(self):
        """Every case at once, inside one jitted function."""
        fns = [fn for _, fn, _, _ in self.cases]
        inputs = [jnp.asarray(x) for _, _, x, _ in self.cases]
        before = [np.asarray(x).tobytes() for x in inputs]
        results = jax.jit(lambda xs: [fn(x) for fn, x in zip(fns, xs)])(inputs)
        for (label, _, _, expected), result, x, was in zip(self.cases, results, inputs, before):
            self.expect(f"{label} in jit", result, expected)
            self.expect_true(f"{label} in jit: the input changed", np.asarray(x).tobytes() == was)

    def run_eagerly(self, labels):
        """The cases whose label contains one of `labels`, one by one, outside jit."""
        for label, fn, x, expected in self.cases:
            if any(part in label for part in labels):
                x = jnp.asarray(x)
                was = np.asarray(x).tobytes()
                self.expect(label, fn(x), expected)
                self.expect_true(f"{label}: the input changed", np.asarray(x).tobytes() == was)
        self.cases = []


def collectives_match_numpy(seed):
    """Every collective over DTYPES and shapes on this rank, inside jit and,
    for a part of the cases, outside; returns the failed checks."""
    join_world()
    checks = Checks(seed)
    for dtype in DTYPES:
        checks.all_reduce(dtype)
        checks.all_gather(dtype)
        checks.reduce_scatter(dtype)
        checks.broadcast(dtype)
        checks.run_jitted()
        outside = ["(7,)", "()"] if dtype in ("float32", "bool") else ["(3, 5)"]
        checks.run_eagerly(outside)
    cc.shutdown()
    return checks.failures


@needs_handlers
@pytest.mark.parametrize("nprocs", [2, 3])
def test_collectives_match_numpy_inside_and_outside_jit(process_ranks, nprocs, seed):
    failures = [f for rank in process_ranks(nprocs, collectives_match_numpy, seed) for f in rank]
    assert not failures, report(failures, seed)


# ---- derivatives -------------------------------------------------------------------------

class GradChecks(RankChecks):
    """Gradients of each rank's sum(w_r * collective(x)) against the analytic
    ones: the program's result is the sum over ranks of what each computes
    (jax.lax's reading), so rank r's gradient gathers every rank's w."""

    def __init__(self, seed):
        super().__init__(seed, cc.rank(), cc.world_size())

    def difference(self, result, expected):
        return difference(result, expected)

    def data(self, shape, op="sum"):
        """Every rank's float64 x, and every rank's weight w of `out_shape`."""
        self.case += 1
        return [rank_data(self.seed, r, self.case, "float64", shape, op) for r in range(self.size)]

    def weights(self, shape):
        self.case += 1
        return [rank_data(self.seed, r, self.case, "float64", shape) for r in range(self.size)]

    def expect_gradient(self, label, collective, xs, ws, expected):
        w = jnp.asarray(ws[self.rank])

        def objective(x):
            return jnp.sum(w * collective(x))
        x = jnp.asarray(xs[self.rank])
        self.expect(f"{label} grad", jax.grad(objective)(x), expected)
        self.expect(f"{label} jit(grad)", jax.jit(jax.grad(objective))(x), expected)

    def all_reduce(self, shape=(5,)):
        n, r = self.size, self.rank
        for op in ("sum", "mean", "max", "min", "prod"):
            xs = self.data(shape, op)
            ws = self.weights(shape)
            total = sum(ws)
            if op == "sum":
                expected = total
            elif op == "mean":
                expected = total / n
            elif op == "prod":
                expected = total * np.prod([xs[q] for q in range(n) if q != r], axis=0)
            else:
                extreme = getattr(np.stack(xs), op)(axis=0)
                ties = sum((x == extreme).astype(float) for x in xs)
                expected = (xs[r] == extreme) * total / ties
            self.expect_gradient(f"all_reduce {op}", lambda x, op=op: cj.all_reduce(x, op),
                                 xs, ws, expected)

    def all_gather(self):
        n, r = self.size, self.rank
        xs = self.data((3, 4))
        ws = self.weights((3, 4 * n))
        self.expect_gradient("all_gather axis=1", lambda x: cj.all_gather(x, axis=1), xs, ws,
                             sum(w[:, 4 * r:4 * r + 4] for w in ws))
        ws = self.weights((n, 3, 4))
        self.expect_gradient("all_gather stacked", lambda x: cj.all_gather(x, tiled=False), xs,
                             ws, sum(w[r] for w in ws))

    def reduce_scatter(self):
        n = self.size
        xs = self.data((2 * n, 3))
        ws = self.weights((2, 3))
        self.expect_gradient("reduce_scatter sum", cj.reduce_scatter, xs, ws, np.concatenate(ws))
        self.expect_gradient("reduce_scatter mean", lambda x: cj.reduce_scatter(x, "mean"), xs,
                             ws, np.concatenate(ws) / n)
        xs = self.data((3, 2 * n))
        ws = self.weights((3, 2))
        maxima = np.max(np.stack(xs), axis=0)
        self.expect_gradient("reduce_scatter max axis=1",
                             lambda x: cj.reduce_scatter(x, "max", axis=1), xs, ws,
                             (xs[self.rank] == maxima) * np.concatenate(ws, axis=1))

    def broadcast(self):
        root = self.size - 1
        xs = self.data((4,))
        ws = self.weights((4,))
        expected = sum(ws) if self.rank == root else np.zeros(4)
        self.expect_gradient("broadcast", lambda x: cj.broadcast(x, root), xs, ws, expected)

    def in_scan(self):
        """A gradient through a collective inside lax.scan: after three steps
        of x <- all_reduce(x, "mean") * 2, rank r's gradient is 8 times the
        mean over ranks of w (each mean transposes to a mean of the
        cotangents)."""
        n = self.size
        xs = self.data((4,))
        ws = self.weights((4,))

        def steps(x):
            return jax.lax.scan(lambda c, _: (cj.all_reduce(c, "mean") * 2, None), x, None,
                                length=3)[0]
        self.expect_gradient("scan of all_reduce mean", steps, xs, ws, sum(ws) * 8 / n)


def gradients_match_analytic(seed):
    join_world()
    checks = GradChecks(seed)
    checks.all_reduce()
    checks.all_gather()
    checks.reduce_scatter()
    checks.broadcast()
    checks.in_scan()
    cc.shutdown()
    return checks.failures


@needs_handlers
def test_gradients_match_the_analytic_ones(process_ranks, seed):
    failures = [f for rank in process_ranks(3, gradients_match_analytic, seed) for f in rank]
    assert not failures, report(failures, seed)


# ---- ordering, loops, disagreement, closed communicators ------------------------------------

_CALL = re.compile(r"%(\S+) = \(.*\) custom-call\((.*)\), custom_call_target=\"(concord_jax_\w+)\"")
_TOKEN = re.compile(r"%(\S+) = token\[\] get-tuple-element\(%(\S+)\), index=1")


def concord_calls(hlo):
    """The concord calls of compiled HLO text, in its order, each as [name,
    target, the name of the call whose token it takes (None: the
    computation's own token)]."""
    token_from = {m.group(1): m.group(2) for m in _TOKEN.finditer(hlo)}
    calls = []
    for match in _CALL.finditer(hlo):
        token = match.group(2).split(", ")[-1].lstrip("%")
        calls.append([match.group(1), match.group(3), token_from.get(token)])
    return calls


def ordering_and_loops(seed):
    """Returns (failed checks, the concord calls of a compiled function)."""
    join_world()
    checks = GradChecks(seed)
    r, n = checks.rank, checks.size

    # Two independent collectives: compiled, each takes the previous one's
    # token, in program order; run, every rank pairs them the same way.
    def two(a, b):
        return cj.all_gather(b), cj.all_reduce(a, "max")
    a = jnp.arange(5.0) + r
    b = jnp.full((3,), r, jnp.int32)
    gathered, maxima = jax.jit(two)(a, b)
    checks.expect("first of two", gathered, np.repeat(np.arange(n, dtype=np.int32), 3))
    checks.expect("second of two", maxima, np.arange(5.0) + n - 1)
    calls = concord_calls(jax.jit(two).lower(a, b).compile().as_text())

    # Hundreds of collectives in one loop: x <- mean over ranks + 1.
    xs = checks.data((4,))
    loop = jax.jit(lambda x: jax.lax.fori_loop(
        0, 300, lambda i, v: cj.all_reduce(v, "mean") + 1.0, x))
    checks.expect("fori_loop of 300 all_reduce", loop(jnp.asarray(xs[r])), sum(xs) / n + 300)
    checks.expect("the same loop again", loop(jnp.asarray(xs[r]) * 2), 2 * sum(xs) / n + 300)

    # all_reduce and broadcast take their operand's buffer when nothing
    # else reads it; an operand read afterwards keeps its values.
    both = jax.jit(lambda v: (cj.all_reduce(v), v * 1, cj.broadcast(v, 0), v + 1))
    summed, same, broadcast, plus = both(jnp.asarray(xs[r]))
    checks.expect("all_reduce of an operand read afterwards", summed, sum(xs))
    checks.expect("the operand read after all_reduce", same, xs[r])
    checks.expect("broadcast of an operand read afterwards", broadcast, xs[0])
    checks.expect("the operand read after broadcast", plus, xs[r] + 1)

    # Under vmap: the batch axis is one more axis of the arrays.
    rows = checks.data((3, 2 * n))
    batched = jax.jit(jax.vmap(lambda v: (cj.all_reduce(v, "max"), cj.all_gather(v),
                                          cj.reduce_scatter(v), cj.broadcast(v, n - 1))))
    maxima, gathered, scattered, broadcast = batched(jnp.asarray(rows[r]))
    checks.expect("vmap of all_reduce", maxima, np.max(np.stack(rows), axis=0))
    checks.expect("vmap of all_gather", gathered, np.concatenate(rows, axis=1))
    checks.expect("vmap of reduce_scatter", scattered, sum(rows)[:, 2 * r:2 * r + 2])
    checks.expect("vmap of broadcast", broadcast, rows[n - 1])
    leading = jax.vmap(cj.reduce_scatter, in_axes=1, out_axes=1)(jnp.asarray(rows[r].T))
    checks.expect("vmap of reduce_scatter over axis 1", leading, sum(rows).T[2 * r:2 * r + 2])

    # A scan gathering every step.
    scan = jax.jit(lambda x: jax.lax.scan(lambda c, i: (c + 1, cj.all_gather(c + i)), x,
                                          jnp.arange(4.0))[1])
    expected = np.stack([np.stack([x + 2 * i for x in xs]).reshape(-1) for i in range(4)])
    checks.expect("scan of all_gather", scan(jnp.asarray(xs[r])), expected)
    cc.shutdown()
    return checks.failures, calls


@needs_handlers
def test_collectives_keep_program_order_run_hundreds_of_times_and_map(process_ranks, seed):
    results = process_ranks(2, ordering_and_loops, seed)
    failures = [f for failed, _ in results for f in failed]
    assert not failures, report(failures, seed)
    for _, calls in results:
        (first, first_target, first_after), (_, second_target, second_after) = calls
        assert (first_target, second_target) == ("concord_jax_all_gather_cpu",
                                                 "concord_jax_all_reduce_cpu"), calls
        assert first_after is None and second_after == first, calls


def disagreeing_ranks():
    """Ranks passing different shapes to one jitted all_reduce; returns what
    each saw, then the result of a collective after it."""
    join_world()
    r = cc.rank()
    f = jax.jit(lambda x: cj.all_reduce(x))
    try:
        f(jnp.ones(3 + r)).block_until_ready()
        seen = "no error"
    except jax.errors.JaxRuntimeError as exc:
        seen = str(exc)
    after = np.asarray(cj.all_reduce(jnp.ones(2))).tolist()
    cc.shutdown()
    return seen, after


@needs_handlers
def test_ranks_that_disagree_inside_jit_get_a_mismatch_error(process_ranks):
    for rank, (seen, after) in enumerate(process_ranks(2, disagreeing_ranks)):
        assert "MismatchError" in seen and "ranks disagree" in seen, (rank, seen)
        assert "float64 shape (3,)" in seen and "float64 shape (4,)" in seen, (rank, seen)
        assert after == [2.0, 2.0]


def closed_communicator():
    """A function traced with a communicator that closed since."""
    join_world()
    comm = cc.world().split(0)
    f = jax.jit(lambda x: cj.all_reduce(x, comm=comm))
    before = np.asarray(f(jnp.ones(2))).tolist()
    comm.close()
    try:
        f(jnp.ones(2)).block_until_ready()
        traced = "no error"
    except jax.errors.JaxRuntimeError as exc:
        traced = str(exc)
    try:
        cj.all_reduce(jnp.ones(2), comm=comm)
        fresh = "no error"
    except cc.ConcordError as exc:
        fresh = str(exc)
    cc.shutdown()
    return before, traced, fresh


@needs_handlers
def test_a_closed_communicator_is_a_clear_error(process_ranks):
    for before, traced, fresh in process_ranks(2, closed_communicator):
        assert before == [2.0, 2.0]
        assert "is closed" in traced and "trace the function again" in traced, traced
        assert "closed" in fresh, fresh


# ---- in this process -------------------------------------------------------------------------

def test_importing_concord_leaves_jax_alone():
    code = ("import sys, concord, concord.metrics, concord.data_parallel; "
            "assert 'jax' not in sys.modules, 'jax was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_build_info_says_whether_the_handlers_were_built():
    info = cc.build_info()["jax"]
    if info["built"]:
        assert info["problem"] is None and info["jaxlib"] == jaxlib.version.__version__, info
        assert _library.problem() is None
    else:
        assert info["jaxlib"] is None and info["problem"], info
        assert _library.problem() == info["problem"]


def test_bad_arguments_raise_while_tracing(world1):
    # Traced from shapes alone: JAX's runtime stays unstarted in this
    # process, which later tests fork.
    x = jax.ShapeDtypeStruct((3, 4), jnp.float32)
    with pytest.raises(cc.InvalidArgumentError, match="unknown op 'avg'"):
        jax.jit(lambda v: cj.all_reduce(v, "avg")).trace(x)
    with pytest.raises(cc.InvalidArgumentError, match="0-d x cannot be concatenated"):
        jax.jit(lambda v: cj.all_gather(v[0, 0])).trace(x)
    with pytest.raises(cc.InvalidArgumentError, match="axis 2 is out of range"):
        jax.jit(lambda v: cj.reduce_scatter(v, axis=2)).trace(x)
    with pytest.raises(cc.InvalidArgumentError, match="axis 3 is out of range"):
        jax.jit(lambda v: cj.all_gather(v, axis=3, tiled=False)).trace(x)


def test_before_init_the_collectives_say_so():
    with pytest.raises(cc.ConcordError, match="not initialised"):
        jax.jit(cj.all_reduce).trace(jax.ShapeDtypeStruct((2,), jnp.float32))


def without_the_handlers():
    """concord.jax as a build without its handlers runs it (where they were
    built, as if they were not): concrete arrays through the eager
    collectives, traced ones refused."""
    join_world()
    _library._problem = _library.problem() or "not built here"
    x = jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3) + cc.rank()
    gathered = cj.all_gather(x, axis=1)
    maxima = cj.all_reduce(x, "max")
    try:
        jax.jit(cj.all_reduce)(x)
        traced = "no error"
    except cc.UnavailableError as exc:
        traced = str(exc)
    cc.shutdown()
    return (type(gathered).__name__, str(gathered.dtype), np.asarray(gathered, float).tolist(),
            np.asarray(maxima, float).tolist(), traced)


def test_without_the_handlers_concrete_arrays_run_eagerly(process_ranks):
    x = np.arange(6.0).reshape(2, 3)
    for kind, dtype, gathered, maxima, traced in process_ranks(2, without_the_handlers):
        assert kind == "ArrayImpl" and dtype == "bfloat16"
        assert gathered == np.concatenate([x, x + 1], axis=1).tolist()
        assert maxima == (x + 1).tolist()
        assert "cannot run inside jax transformations" in traced, traced


# ---- on a GPU --------------------------------------------------------------------------------

def on_the_gpu(seed):
    """The CUDA handlers on a world of one (NCCL, on XLA's stream): the
    failed checks, or why JAX cannot run on a GPU here."""
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as exc:
        return f"JAX sees no GPU: {exc}"
    jax.config.update("jax_enable_x64", True)
    cc.init(timeout=120.0)
    checks = Checks(seed)
    for dtype in ("float32", "bfloat16", "int32"):
        checks.all_reduce(dtype)
        checks.all_gather(dtype)
        checks.reduce_scatter(dtype)
        checks.broadcast(dtype)
        with jax.default_device(gpu):
            checks.run_jitted()
            checks.run_eagerly(["(7,)"])
    x = jax.device_put(jnp.arange(5.0), gpu)
    looped = jax.jit(lambda v: jax.lax.fori_loop(0, 100, lambda i, c: cj.all_reduce(c) + 1, v))
    checks.expect("fori_loop on the GPU", looped(x), np.arange(5.0) + 100)
    checks.expect("grad on the GPU", jax.jit(jax.grad(lambda v: jnp.sum(cj.all_reduce(v) ** 2)))(x),
                  2 * np.arange(5.0))
    cc.shutdown()
    return checks.failures


@needs_handlers
@pytest.mark.gpu
def test_the_cuda_handlers_on_a_gpu(process_ranks, seed):
    result, = process_ranks(1, on_the_gpu, seed)
    if isinstance(result, str):
        pytest.skip(result)
    assert not result, report(result, seed)
