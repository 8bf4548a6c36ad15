"""Functional reductions of metric pytrees across ranks (the datarax API).

``metrics`` is any pytree (dict, list, tuple, namedtuple, nested; None
leaves pass through) whose leaves are arrays (NumPy or CPU DLPack: torch,
JAX) or Python / NumPy scalars. Leaves are reduced element-wise across the
ranks of ``axis_name`` (None: the whole world; with a mesh active, one of its
axes; with no mesh, any name means the whole world). Every rank must pass
the same structure with the same shapes and dtypes.

Each call issues one fused collective per reduce op, whatever the number
of leaves (``all_reduce_multi``: one collective per dtype underneath), and
never writes the caller's leaves. Results come back in each leaf's own
type: NumPy arrays as NumPy, torch tensors as torch, NumPy scalars as NumPy
scalars, Python scalars as Python scalars.

Dtype rules: integer arrays reduce in their dtype ("mean" is the exact mean
truncated toward zero, as integer division); Python ints and bools averaged
come back as floats; bools summed come back as ints (counts).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import optree

from . import collectives
from .arrays import namespace
from .metrics_base import to_numpy

__all__ = [
    "all_gather",
    "collect_from_devices",
    "reduce_custom",
    "reduce_max",
    "reduce_mean",
    "reduce_mean_collective",
    "reduce_min",
    "reduce_sum",
    "reduce_sum_collective",
]

OPS = ("mean", "sum", "max", "min")
_PYTHON_SCALARS = (bool, int, float)


def _comm(axis_name):
    # Imported on first use: importing concord (which imports metrics) must
    # not depend on the mesh module.
    from .mesh import axis_comm

    return axis_comm(axis_name)


def _host_copy(leaf, op=None):
    """A fresh contiguous NumPy copy of `leaf` that `op` can reduce in place
    (bools become int64 for "sum", float64 for "mean"; Python ints become
    float64 for "mean")."""
    array = np.array(to_numpy(leaf), copy=True, order="C")
    if array.dtype.kind not in "biuf":
        raise ValueError(f"metrics: cannot reduce a leaf of type {type(leaf).__name__} "
                         f"(dtype {array.dtype}); expected numbers or numeric arrays")
    if op == "sum" and array.dtype.kind == "b":
        return array.astype(np.int64)
    if op == "mean" and (array.dtype.kind == "b" or isinstance(leaf, int)):
        return array.astype(np.float64)
    return array


def _restore(leaf, array):
    """`array` (a NumPy result for `leaf`) in the leaf's own type."""
    if isinstance(leaf, _PYTHON_SCALARS):
        return array.item()
    if isinstance(leaf, np.generic):
        return array[()]
    if isinstance(leaf, np.ndarray):
        return array
    return namespace(leaf).asarray(array)


def _op_of(path, reduce_fn):
    return reduce_fn.get(path[0], "mean") if path else "mean"


def _checked_reduce_fn(reduce_fn):
    if reduce_fn is None:
        return {}
    if not isinstance(reduce_fn, Mapping):
        raise ValueError(f"reduce_custom: reduce_fn must be a dict, got {type(reduce_fn).__name__}")
    checked = {}
    for key, op in reduce_fn.items():
        name = op.lower() if isinstance(op, str) else op
        if name is not None and name not in OPS:
            raise ValueError(f"reduce_custom: unknown reduce op {op!r} for {key!r}; expected one "
                             f"of {', '.join(map(repr, OPS))} or None")
        checked[key] = name
    return checked


def _reduce(leaves, ops, axis_name):
    """The leaves reduced by their ops (None: passed through), one
    all_reduce_multi per op, all in flight together."""
    buffers = [None if op is None else _host_copy(leaf, op) for leaf, op in zip(leaves, ops)]
    groups = {op: [b for b, o in zip(buffers, ops) if o == op] for op in OPS}
    groups = {op: group for op, group in groups.items() if group}
    if groups:
        comm = _comm(axis_name)
        works = [comm._handle.all_reduce_multi(group, op, True) for op, group in groups.items()]
        for work in works:
            work.wait()
    return [leaf if op is None else _restore(leaf, buffer)
            for leaf, op, buffer in zip(leaves, ops, buffers)]


def reduce_custom(metrics, reduce_fn=None, *, axis_name=None):
    """Reduces each top-level entry of `metrics` with its own op:
    reduce_fn = {"loss": "mean", "n": "sum", "x": None}. Missing keys use
    "mean"; None passes the value through unchanged; an unknown op raises
    ValueError (before any communication)."""
    reduce_fn = _checked_reduce_fn(reduce_fn)
    paths, leaves, treedef = optree.tree_flatten_with_path(metrics)
    ops = [_op_of(path, reduce_fn) for path in paths]
    return optree.tree_unflatten(treedef, _reduce(leaves, ops, axis_name))


def _reduce_all(metrics, op, axis_name):
    leaves, treedef = optree.tree_flatten(metrics)
    return optree.tree_unflatten(treedef, _reduce(leaves, [op] * len(leaves), axis_name))


def reduce_mean(metrics, *, axis_name=None):
    """Element-wise mean of every leaf across ranks."""
    return _reduce_all(metrics, "mean", axis_name)


def reduce_sum(metrics, *, axis_name=None):
    """Element-wise sum of every leaf across ranks."""
    return _reduce_all(metrics, "sum", axis_name)


def reduce_max(metrics, *, axis_name=None):
    """Element-wise maximum of every leaf across ranks."""
    return _reduce_all(metrics, "max", axis_name)


def reduce_min(metrics, *, axis_name=None):
    """Element-wise minimum of every leaf across ranks."""
    return _reduce_all(metrics, "min", axis_name)


def reduce_mean_collective(metrics, axis_name="batch"):
    """reduce_mean over `axis_name` (the seeds' default "batch" means the
    whole world when no mesh is active)."""
    return reduce_mean(metrics, axis_name=axis_name)


def reduce_sum_collective(metrics, axis_name="batch"):
    """reduce_sum over `axis_name`."""
    return reduce_sum(metrics, axis_name=axis_name)


def _gather_leaves(leaves, axis_name):
    """Every leaf of every rank as a NumPy array (ranks, *shape): one
    all-gather per dtype, the leaves of a dtype packed into one buffer."""
    host = [_host_copy(leaf) for leaf in leaves]
    by_dtype = {}
    for i, array in enumerate(host):
        by_dtype.setdefault(array.dtype, []).append(i)
    if not host:
        return []
    comm = _comm(axis_name)
    works = {dtype: collectives.all_gather(
                 np.concatenate([host[i].reshape(-1) for i in members]), tiled=False, comm=comm,
                 async_op=True)
             for dtype, members in by_dtype.items()}
    stacked = [None] * len(host)
    for dtype, members in by_dtype.items():
        gathered = works[dtype].wait()
        offset = 0
        for i in members:
            size = host[i].size
            stacked[i] = gathered[:, offset:offset + size].reshape(len(gathered), *host[i].shape)
            offset += size
    return stacked


def all_gather(metrics, *, axis_name=None):
    """Every leaf with a new leading rank axis: (ranks, *shape), in the
    leaf's array type (Python and NumPy scalars become NumPy arrays)."""
    leaves, treedef = optree.tree_flatten(metrics)
    stacked = _gather_leaves(leaves, axis_name)
    results = [s if isinstance(leaf, (*_PYTHON_SCALARS, np.generic)) else _restore(leaf, s)
               for leaf, s in zip(leaves, stacked)]
    return optree.tree_unflatten(treedef, results)


def collect_from_devices(metrics, *, axis_name=None):
    """Every leaf as a Python list with one value per rank, in rank order,
    each in the leaf's own type."""
    leaves, treedef = optree.tree_flatten(metrics)
    stacked = _gather_leaves(leaves, axis_name)
    results = [[_restore(leaf, row) for row in s] for leaf, s in zip(leaves, stacked)]
    return optree.tree_unflatten(treedef, results)
