"""Functional reductions of metric pytrees across ranks (the datarax API).

``metrics`` is any pytree (dict, list, tuple, namedtuple, nested; None
leaves pass through) whose leaves are arrays (NumPy, torch, CuPy, JAX, or
any CPU DLPack array) or Python / NumPy scalars. torch and CuPy leaves are
reduced where they live (a GPU's through NCCL, on the library's current
stream, with no host synchronisation); the other leaves as host NumPy
copies. Leaves are reduced element-wise across the
ranks of ``axis_name`` (None: the whole world; with a mesh active, one of its
axes; with no mesh, any name means the whole world). Every rank must pass
the same structure (keys included) with the same shapes, dtypes and reduce
ops: each call first compares a fingerprint of them across the ranks (one
small blocking all-gather) and raises MismatchError on every rank when they
differ, instead of mixing values or hanging.

Each call issues one fused collective per reduce op, whatever the number
of leaves and device (``all_reduce_multi``: one collective per dtype
underneath), and never writes the caller's leaves. Results come back in
each leaf's own type and on its device: NumPy arrays as NumPy, torch
tensors as torch (CUDA ones on their GPU), NumPy scalars as NumPy scalars,
Python scalars as Python scalars.

Inside jax.jit (JAX tracers among the leaves) the reductions and gathers
run through concord.jax, in the compiled computation, and return JAX arrays.

Dtype rules: integer arrays reduce in their dtype ("mean" is the exact mean
truncated toward zero, as integer division); Python ints and bools averaged
come back as floats; bools summed come back as ints (counts).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import optree
from array_api_compat import device as array_device
from array_api_compat import is_jax_array, is_torch_array

from .._host import device_key, to_host
from .._pytree import agree, fused_all_gather, group_indices
from .._traced import traced
from ..arrays import namespace
from ..mesh import axis_comm

__all__ = [
    "all_gather",
    "collect_from_devices",
    "reduce_custom",
    "reduce_max",
    "reduce_mean",
    "reduce_min",
    "reduce_sum",
]

OPS = ("mean", "sum", "max", "min")
_PYTHON_SCALARS = (bool, int, float)


def _own_namespace(leaf):
    """The namespace of a leaf reduced in its own library on its own device
    (torch, CuPy: array-API arrays that can be written in place), or None
    for a leaf reduced as a host NumPy copy (NumPy arrays and scalars,
    Python scalars, JAX arrays, other DLPack arrays)."""
    if (isinstance(leaf, (np.ndarray, np.generic)) or not hasattr(leaf, "__dlpack__")
            or is_jax_array(leaf)):
        return None
    try:
        return namespace(leaf)
    except TypeError:
        return None


def _bad_leaf(leaf, dtype):
    return ValueError(f"metrics: cannot reduce a leaf of type {type(leaf).__name__} "
                      f"(dtype {dtype}); expected numbers or numeric arrays")


def _host_copy(leaf, op=None):
    """A fresh contiguous NumPy copy of `leaf` that `op` can reduce in place
    (bools become int64 for "sum", float64 for "mean"; Python ints become
    float64 for "mean")."""
    array = to_host(leaf)
    if not array.flags.c_contiguous:
        array = np.array(array, order="C")
    if array.dtype.kind not in "biuf":
        raise _bad_leaf(leaf, array.dtype)
    if op == "sum" and array.dtype.kind == "b":
        return array.astype(np.int64)
    if op == "mean" and (array.dtype.kind == "b" or isinstance(leaf, int)):
        return array.astype(np.float64)
    return array


def _device_copy(leaf, xp, op=None):
    """A fresh contiguous copy of an array leaf in its own namespace, on its
    own device, that `op` can reduce in place (bools become int64 for "sum",
    float64 for "mean"). Reads no data on the host."""
    if is_torch_array(leaf):
        leaf = leaf.detach()
    dtype = leaf.dtype
    if not xp.isdtype(dtype, ("bool", "integral", "real floating")):
        raise _bad_leaf(leaf, dtype)
    if op in ("sum", "mean") and dtype == xp.bool:
        dtype = xp.int64 if op == "sum" else xp.float64
    shape = tuple(leaf.shape)
    flat = xp.reshape(leaf, (-1,))  # row-major; copies only a non-contiguous leaf
    return xp.reshape(xp.astype(flat, dtype, copy=True), shape)


def _copy(leaf, op=None):
    """The buffer a leaf is reduced in: in its own namespace on its own
    device where it can be, else a host NumPy copy."""
    xp = _own_namespace(leaf)
    return _host_copy(leaf, op) if xp is None else _device_copy(leaf, xp, op)


def _restore(leaf, array):
    """`array` (the result for `leaf`, from its buffer) in the leaf's own type."""
    if isinstance(leaf, _PYTHON_SCALARS):
        return array.item()
    if isinstance(leaf, np.generic):
        return array[()]
    if isinstance(leaf, np.ndarray) or not isinstance(array, np.ndarray):
        return array  # already of the leaf's type, on its device
    return namespace(leaf).asarray(array, device=array_device(leaf))


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


def _describe(buffer):
    """What ranks must agree on about a leaf's buffer: shape, dtype, and
    whether it is on the host or a GPU."""
    return f"{tuple(buffer.shape)}{buffer.dtype}@{device_key(buffer)[0]}"


def _agree(what, comm, treedef, descriptions):
    """Raises MismatchError on every rank of `comm` unless all passed the
    same pytree structure and the same leaf descriptions."""
    mine = f"{treedef} with leaves " + ", ".join(descriptions)
    agree(comm, mine, f"{what}: ranks passed different metric pytrees (structure and keys, "
                      "leaf shapes, dtypes, devices or reduce ops)", mine=mine)


def _reduce(what, treedef, leaves, ops, axis_name):
    """The leaves reduced by their ops (None: passed through), one
    all_reduce_multi per op and device (host leaves in one, GPU leaves in
    another), all in flight together, once the ranks agreed on what they
    reduce. Inside jax.jit (JAX tracers among the leaves) concord.jax
    reduces them in the computation."""
    if traced(leaves):
        from ..jax import _trees
        return _trees.reduce_metric_leaves(leaves, ops, axis_comm(axis_name))
    buffers = [None if op is None else _copy(leaf, op) for leaf, op in zip(leaves, ops)]
    comm = axis_comm(axis_name)
    _agree(what, comm, treedef, [f"{op}:{'-' if buffer is None else _describe(buffer)}"
                                 for op, buffer in zip(ops, buffers)])
    reduced = [i for i, op in enumerate(ops) if op is not None]
    groups = group_indices((OPS.index(ops[i]), device_key(buffers[i])) for i in reduced)
    if groups:
        works = [comm._handle.all_reduce_multi([buffers[reduced[j]] for j in members],
                                               OPS[op_index], True)
                 for (op_index, _), members in sorted(groups.items(), key=_group_order)]
        for work in works:
            work.wait()
    return [leaf if op is None else _restore(leaf, buffer)
            for leaf, op, buffer in zip(leaves, ops, buffers)]


def _group_order(item):
    """Groups by op (in OPS order), then by first appearance."""
    (op_index, _), members = item
    return op_index, members[0]


def reduce_custom(metrics, reduce_fn=None, *, axis_name=None):
    """Reduces each top-level entry of `metrics` with its own op:
    reduce_fn = {"loss": "mean", "n": "sum", "x": None}. Missing keys use
    "mean"; None passes the value through unchanged; an unknown op raises
    ValueError (before any communication)."""
    reduce_fn = _checked_reduce_fn(reduce_fn)
    paths, leaves, treedef = optree.tree_flatten_with_path(metrics)
    ops = [_op_of(path, reduce_fn) for path in paths]
    return optree.tree_unflatten(treedef, _reduce("reduce_custom", treedef, leaves, ops,
                                                  axis_name))


def _reduce_all(what, metrics, op, axis_name):
    leaves, treedef = optree.tree_flatten(metrics)
    return optree.tree_unflatten(treedef, _reduce(what, treedef, leaves, [op] * len(leaves),
                                                  axis_name))


def reduce_mean(metrics, *, axis_name=None):
    """Element-wise mean of every leaf across ranks."""
    return _reduce_all("reduce_mean", metrics, "mean", axis_name)


def reduce_sum(metrics, *, axis_name=None):
    """Element-wise sum of every leaf across ranks."""
    return _reduce_all("reduce_sum", metrics, "sum", axis_name)


def reduce_max(metrics, *, axis_name=None):
    """Element-wise maximum of every leaf across ranks."""
    return _reduce_all("reduce_max", metrics, "max", axis_name)


def reduce_min(metrics, *, axis_name=None):
    """Element-wise minimum of every leaf across ranks."""
    return _reduce_all("reduce_min", metrics, "min", axis_name)


def _gather_leaves(what, treedef, leaves, axis_name):
    """Every leaf of every rank as an array (ranks, *shape): NumPy for host
    copies, the leaf's own namespace on its device otherwise; one
    all-gather per kind of array, the leaves packed into one buffer, once
    the ranks agreed on what they gather (inside jax.jit, through
    concord.jax)."""
    if traced(leaves):
        from ..jax import _trees
        return _trees.gather_leaves(leaves, axis_comm(axis_name))
    copies = [_copy(leaf) for leaf in leaves]
    comm = axis_comm(axis_name)
    _agree(what, comm, treedef, [_describe(copy) for copy in copies])
    return fused_all_gather(copies, comm) if copies else []


def all_gather(metrics, axis_name=None):
    """Every leaf with a new leading rank axis: (ranks, *shape), in the
    leaf's array type (Python and NumPy scalars become NumPy arrays).
    `axis_name` may be passed by position, as datarax's all_gather takes it."""
    leaves, treedef = optree.tree_flatten(metrics)
    stacked = _gather_leaves("all_gather", treedef, leaves, axis_name)
    results = [s if isinstance(leaf, (*_PYTHON_SCALARS, np.generic)) else _restore(leaf, s)
               for leaf, s in zip(leaves, stacked)]
    return optree.tree_unflatten(treedef, results)


def collect_from_devices(metrics, *, axis_name=None):
    """Every leaf as a Python list with one value per rank, in rank order,
    each in the leaf's own type."""
    leaves, treedef = optree.tree_flatten(metrics)
    stacked = _gather_leaves("collect_from_devices", treedef, leaves, axis_name)
    results = [[_restore(leaf, row) for row in s] for leaf, s in zip(leaves, stacked)]
    return optree.tree_unflatten(treedef, results)
