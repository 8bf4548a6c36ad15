"""Pytrees of JAX arrays reduced or gathered across ranks inside jax.jit:
what concord.metrics' functional reductions and concord.data_parallel's
gradient reductions do when they are handed tracers. One collective per
(op, dtype) on the leaves packed into one buffer, as outside jit. And the
parameter gathers of concord.data_parallel (gather_params,
gather_array_with_mean_grads) on tracers, whose gradients are xlstm-jax's.
"""

import jax
import jax.numpy as jnp

from .._pytree import group_indices, pack, unpack
from ._collectives import all_gather, all_reduce, reduce_scatter

__all__ = ["gather_leaves", "gather_with_backward", "gather_with_mean_grads", "reduce_leaves",
           "reduce_metric_leaves"]


def reduce_leaves(leaves, ops, comm):
    """Each leaf (a JAX array) reduced over `comm` by its op (None: passed
    through), as new arrays: one all_reduce per (op, dtype)."""
    results = list(leaves)
    groups = group_indices((op, leaf.dtype) if op is not None else None
                           for leaf, op in zip(leaves, ops))
    for key, indices in groups.items():
        if key is None:
            continue
        members = [leaves[i] for i in indices]
        reduced = all_reduce(pack(members), key[0], comm=comm)
        for index, part in zip(indices, unpack(reduced, members)):
            results[index] = part
    return results


def _metric_leaf(leaf, op):
    """A metric leaf as the JAX array it is reduced in, by concord.metrics'
    dtype rules: bools summed become integers (counts); bools and Python
    ints averaged become floats."""
    array = jnp.asarray(leaf)
    if op == "sum" and array.dtype == jnp.bool_:
        return array.astype(jax.dtypes.canonicalize_dtype(jnp.int64))
    if op == "mean" and (array.dtype == jnp.bool_ or isinstance(leaf, int)):
        return array.astype(jax.dtypes.canonicalize_dtype(jnp.float64))
    return array


def reduce_metric_leaves(leaves, ops, comm):
    """concord.metrics' reduction of leaves (JAX arrays, tracers among them,
    or Python and NumPy scalars) by their ops (None: passed through)."""
    arrays = [leaf if op is None else _metric_leaf(leaf, op) for leaf, op in zip(leaves, ops)]
    return reduce_leaves(arrays, ops, comm)


def gather_leaves(leaves, comm):
    """Every rank's leaves, each with a leading rank axis (ranks, *shape):
    one all_gather per dtype."""
    arrays = [jnp.asarray(leaf) for leaf in leaves]
    results = list(arrays)
    for indices in group_indices(array.dtype for array in arrays).values():
        members = [arrays[i] for i in indices]
        gathered = all_gather(pack(members), tiled=False, comm=comm)
        for index, part in zip(indices, unpack(gathered, members)):
            results[index] = part
    return results


def _mean_scatter(cotangent, axis, comm, grad_scatter_dtype, dtype):
    """xlstm-jax's gradient of a gathered block: the cotangent, cast to
    grad_scatter_dtype (None: `dtype`, the block's), reduce-scattered along
    `axis` with a mean over the ranks, cast to `dtype`."""
    cotangent = cotangent.astype(dtype if grad_scatter_dtype is None else grad_scatter_dtype)
    return reduce_scatter(cotangent, "mean", axis=axis, comm=comm).astype(dtype)


def gather_with_mean_grads(x, axis, comm, gather_dtype=None, grad_scatter_dtype=None):
    """`x` all-gathered along `axis` (tiled; cast to gather_dtype first),
    differentiated as xlstm-jax's gather: by _mean_scatter (a mean over the
    ranks, not jax.lax.all_gather's sum)."""
    dtype = x.dtype

    @jax.custom_vjp
    def gather(x):
        return all_gather(x if gather_dtype is None else x.astype(gather_dtype), axis=axis,
                          comm=comm)

    def forward(x):
        return gather(x), None

    def backward(_, cotangent):
        return (_mean_scatter(cotangent, axis, comm, grad_scatter_dtype, dtype),)

    gather.defvjp(forward, backward)
    return gather(x)


def gather_with_backward(x, axis, comm, gather_dtype=None, grad_scatter_dtype=None):
    """(gather_with_mean_grads(x, ...), its backward: grad_full -> the
    gradient of x)."""
    full = gather_with_mean_grads(x, axis, comm, gather_dtype, grad_scatter_dtype)
    return full, lambda grad_full: _mean_scatter(jnp.asarray(grad_full), axis, comm,
                                                 grad_scatter_dtype, x.dtype)
