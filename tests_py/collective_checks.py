"""Collective checks one rank runs against NumPy references: every rank
makes every rank's data from (seed, rank, case), so each computes the
reference itself; failures are collected (see helpers.RankChecks). Used by
the ranks of test_collectives.py and test_multihost.py."""

import ml_dtypes  # noqa: F401 (gives NumPy the dtype name "bfloat16")
import numpy as np

import concord as cc
from helpers import RankChecks, array_difference, ops_for, rank_data, reference_reduce

TOLERANCE = {"bfloat16": (1e-2, 1e-2), "float16": (2e-3, 2e-3), "float32": (1e-5, 1e-6),
             "float64": (1e-12, 1e-12)}


def difference(result, expected):
    """What is wrong with result, or None."""
    if type(result) is not np.ndarray:
        return f"result is a {type(result).__name__}, expected a numpy.ndarray"
    return array_difference(result, expected, TOLERANCE)


class Checks(RankChecks):
    """The checks of one rank of a communicator (the world by default), on
    NumPy arrays, through the module's collectives."""

    def __init__(self, seed, comm=None):
        self.comm = cc.world() if comm is None else comm
        super().__init__(seed, self.comm.rank, self.comm.size)

    def difference(self, result, expected):
        return difference(result, expected)

    def data(self, dtype, shape, op="sum"):
        """Every rank's data for a new case; this rank's is [self.rank]."""
        self.case += 1
        return [rank_data(self.seed, r, self.case, dtype, shape, op).astype(dtype, copy=False)
                for r in range(self.size)]

    def expect_untouched(self, label, x, copy):
        self.expect_true(f"{label}: the input changed", np.array_equal(x, copy))

    # ---- all_reduce ---------------------------------------------------------

    def all_reduce(self, dtype, shape, *, variants=True):
        for op in ops_for(dtype):
            xs = self.data(dtype, shape, op)
            x = xs[self.rank]
            copy = x.copy()
            label = f"all_reduce {op} {dtype} {shape}"
            self.expect(label, cc.all_reduce(x, op, comm=self.comm), reference_reduce(xs, op))
            self.expect_untouched(label, x, copy)
        op = ops_for(dtype)[0]
        label = f"all_reduce {op} {dtype} {shape}"

        xs = self.data(dtype, shape, op)
        y = xs[self.rank].copy()
        result = cc.all_reduce(y, op, out=y, comm=self.comm)
        self.expect_true(f"{label} in place: result is not out", result is y)
        self.expect(f"{label} in place", y, reference_reduce(xs, op))
        if not variants:
            return

        xs = self.data(dtype, shape, op)
        out = np.empty(shape, dtype)
        result = cc.all_reduce(xs[self.rank], op, out=out, comm=self.comm)
        self.expect_true(f"{label} out=: result is not out", result is out)
        self.expect(f"{label} out=", out, reference_reduce(xs, op))

        cases = [(op, self.data(dtype, shape, op)) for op in ops_for(dtype)]
        works = [cc.all_reduce(xs[self.rank], op, async_op=True, comm=self.comm)
                 for op, xs in cases]
        for (op, xs), work in zip(cases, works):
            self.expect(f"all_reduce {op} {dtype} {shape} async", work.wait(),
                        reference_reduce(xs, op))
            self.expect_true(f"all_reduce {op} {dtype} {shape} async: not done", work.done())

    # ---- all_gather -----------------------------------------------------------

    def all_gather(self, dtype, shape, *, variants=True):
        label = f"all_gather {dtype} {shape}"
        xs = self.data(dtype, shape)
        x = xs[self.rank]
        copy = x.copy()
        self.expect(f"{label} tiled", cc.all_gather(x, comm=self.comm), np.concatenate(xs))
        self.expect(f"{label} stacked", cc.all_gather(x, tiled=False, comm=self.comm), np.stack(xs))
        self.expect_untouched(label, x, copy)
        if not variants:
            return

        xs = self.data(dtype, shape)
        out = np.empty((self.size * shape[0], *shape[1:]), dtype)
        result = cc.all_gather(xs[self.rank], out=out, comm=self.comm)
        self.expect_true(f"{label} out=: result is not out", result is out)
        self.expect(f"{label} out=", out, np.concatenate(xs))

        xs = self.data(dtype, shape)
        work = cc.all_gather(xs[self.rank], tiled=False, async_op=True, comm=self.comm)
        self.expect(f"{label} async", work.wait(), np.stack(xs))

    def all_gather_axes(self, dtype):
        shape = (2, 5, 3)
        label = f"all_gather {dtype} {shape}"
        xs = self.data(dtype, shape)
        x = xs[self.rank]
        self.expect(f"{label} axis=1", cc.all_gather(x, axis=1, comm=self.comm),
                    np.concatenate(xs, axis=1))
        self.expect(f"{label} axis=-1", cc.all_gather(x, axis=-1, comm=self.comm),
                    np.concatenate(xs, axis=-1))
        self.expect(f"{label} stacked axis=2",
                    cc.all_gather(x, axis=2, tiled=False, comm=self.comm),
                    np.stack(xs, axis=2))
        self.expect(f"{label} stacked axis=-1",
                    cc.all_gather(x, axis=-1, tiled=False, comm=self.comm),
                    np.stack(xs, axis=-1))
        self.expect(f"{label} 0-d stacked", cc.all_gather(x[0, 0, 0], tiled=False, comm=self.comm),
                    np.stack([a[0, 0, 0] for a in xs]))

        xs = self.data(dtype, shape)
        out = np.empty((2, 5, 3 * self.size), dtype)
        result = cc.all_gather(xs[self.rank], axis=2, out=out, comm=self.comm)
        self.expect_true(f"{label} axis=2 out=: result is not out", result is out)
        self.expect(f"{label} axis=2 out=", out, np.concatenate(xs, axis=2))

        xs = self.data(dtype, shape)
        work = cc.all_gather(xs[self.rank], axis=1, tiled=False, async_op=True, comm=self.comm)
        self.expect(f"{label} stacked axis=1 async", work.wait(), np.stack(xs, axis=1))

    # ---- reduce_scatter -------------------------------------------------------

    def reduce_scatter(self, dtype, block, *, variants=True):
        shape = (self.size * block,)
        mine = slice(self.rank * block, (self.rank + 1) * block)
        for op in ops_for(dtype):
            xs = self.data(dtype, shape, op)
            x = xs[self.rank]
            copy = x.copy()
            label = f"reduce_scatter {op} {dtype} {shape}"
            expected = reference_reduce(xs, op)[mine]
            self.expect(label, cc.reduce_scatter(x, op, comm=self.comm), expected)
            self.expect_untouched(label, x, copy)
        if not variants:
            return
        op = ops_for(dtype)[0]
        label = f"reduce_scatter {op} {dtype} {shape}"

        xs = self.data(dtype, shape, op)
        out = np.empty((block,), dtype)
        result = cc.reduce_scatter(xs[self.rank], op, out=out, comm=self.comm)
        self.expect_true(f"{label} out=: result is not out", result is out)
        self.expect(f"{label} out=", out, reference_reduce(xs, op)[mine])

        xs = self.data(dtype, shape, op)
        work = cc.reduce_scatter(xs[self.rank], op, async_op=True, comm=self.comm)
        self.expect(f"{label} async", work.wait(), reference_reduce(xs, op)[mine])

    def reduce_scatter_axes(self, dtype):
        shape = (3, 2 * self.size, 2)
        mine = (slice(None), slice(2 * self.rank, 2 * self.rank + 2))
        for op in ops_for(dtype):
            xs = self.data(dtype, shape, op)
            x = xs[self.rank]
            copy = x.copy()
            label = f"reduce_scatter {op} {dtype} {shape} axis=1"
            self.expect(label, cc.reduce_scatter(x, op, axis=1, comm=self.comm),
                        reference_reduce(xs, op)[mine])
            self.expect_untouched(label, x, copy)
        op = ops_for(dtype)[0]
        xs = self.data(dtype, shape, op)
        out = np.empty((3, 2, 2), dtype)
        result = cc.reduce_scatter(xs[self.rank], op, axis=-2, out=out, comm=self.comm)
        self.expect_true("reduce_scatter axis=-2 out=: result is not out", result is out)
        self.expect(f"reduce_scatter {op} {dtype} {shape} axis=-2 out=", out,
                    reference_reduce(xs, op)[mine])

    # ---- broadcast --------------------------------------------------------------

    def broadcast(self, dtype, shape, roots):
        for root in roots:
            label = f"broadcast root={root} {dtype} {shape}"
            xs = self.data(dtype, shape)
            x = xs[self.rank] if self.rank == root else np.zeros(shape, dtype)
            copy = x.copy()
            self.expect(label, cc.broadcast(x, root, comm=self.comm), xs[root])
            self.expect_untouched(label, x, copy)

            xs = self.data(dtype, shape)
            y = xs[self.rank].copy() if self.rank == root else np.zeros(shape, dtype)
            result = cc.broadcast(y, root, out=y, comm=self.comm)
            self.expect_true(f"{label} in place: result is not out", result is y)
            self.expect(f"{label} in place", y, xs[root])

            xs = self.data(dtype, shape)
            work = cc.broadcast(xs[self.rank], root, async_op=True, comm=self.comm)
            self.expect(f"{label} async", work.wait(), xs[root])

    # ---- all_reduce_multi -------------------------------------------------------

    def all_reduce_multi(self, dtypes, sizes, *, async_op=False):
        """One collective over arrays of several dtypes and sizes, each
        reduced in place."""
        for op in ("sum", "max"):
            cases = [(dtype, self.data(dtype, (size,), op)) for dtype in dtypes for size in sizes
                     if op in ops_for(dtype)]
            arrays = [xs[self.rank].copy() for _, xs in cases]
            label = f"all_reduce_multi {op}" + (" async" if async_op else "")
            if async_op:
                result = self.comm._handle.all_reduce_multi(arrays, op, True).wait()
            else:
                result = self.comm._handle.all_reduce_multi(arrays, op, False)
            self.expect_true(f"{label}: results are not the inputs",
                             all(r is a for r, a in zip(result, arrays)))
            for (dtype, xs), got in zip(cases, arrays):
                self.expect(f"{label} {dtype} {got.shape}", got, reference_reduce(xs, op))
