"""The collectives of concord.jax: concord's collectives for JAX arrays,
inside jax.jit and outside it.

Each returns a new array (JAX arrays are immutable: nothing is written in
place) and runs as an XLA FFI call on the communicator (the world unless
`comm=` is given). Arguments are checked when the call is traced, before
any communication. Without the handler library (build_info()["jax"])
concrete arrays still go through concord's eager collectives, as NumPy
copies; traced ones raise UnavailableError.
"""

import operator

import jax
import jax.numpy as jnp
import numpy as np

from .. import _world, collectives
from .._constants import REDUCE_OPS
from ..arrays import blocks_to_front, front_to_axis, gathered_shape, scattered_shape
from ..errors import InvalidArgumentError
from . import _library
from ._primitives import Group, all_gather_p, all_reduce_p, broadcast_p, reduce_scatter_p

__all__ = ["all_gather", "all_reduce", "broadcast", "reduce_scatter"]


def _communicator(comm):
    return _world.current() if comm is None else comm


def _group(comm):
    return Group(_library.comm_id(comm), comm.rank, comm.size)


def _check_op(op):
    if not isinstance(op, str) or op not in REDUCE_OPS:
        raise InvalidArgumentError(f"unknown op {op!r}; valid ops: {', '.join(REDUCE_OPS)}")


def _eagerly(x):
    """Without the handler library, arrays with a value go through the
    eager collectives; traced ones cannot (comm_id says why)."""
    return _library.problem() is not None and not isinstance(x, jax.core.Tracer)


def all_reduce(x, op="sum", *, comm=None):
    """Every rank gets `op` ("sum", "mean", "max", "min", "prod") over all
    ranks' `x`, elementwise; differentiable like jax.lax.psum (see
    concord.jax)."""
    comm = _communicator(comm)
    _check_op(op)
    if _eagerly(x):
        return jnp.asarray(collectives.all_reduce(np.asarray(x), op, comm=comm))
    return all_reduce_p.bind(jnp.asarray(x), comm=_group(comm), op=op)


def all_gather(x, *, axis=0, tiled=True, comm=None):
    """Every rank gets all ranks' `x` in rank order: concatenated along
    `axis` when tiled, else stacked along a new rank axis at `axis`;
    differentiable like jax.lax.all_gather."""
    comm = _communicator(comm)
    x = jnp.asarray(x)
    axis, _ = gathered_shape(x.shape, comm.size, axis, tiled)
    if _eagerly(x):
        return jnp.asarray(collectives.all_gather(np.asarray(x), axis=axis, tiled=tiled, comm=comm))
    return front_to_axis(all_gather_p.bind(x, comm=_group(comm)), axis, tiled)


def reduce_scatter(x, op="sum", *, axis=0, comm=None):
    """`x` split evenly along `axis` into one block per rank; rank r gets
    `op` over all ranks of block r; differentiable like
    jax.lax.psum_scatter (tiled)."""
    comm = _communicator(comm)
    _check_op(op)
    x = jnp.asarray(x)
    axis, _ = scattered_shape(x.shape, comm.size, axis)
    if _eagerly(x):
        return jnp.asarray(collectives.reduce_scatter(np.asarray(x), op, axis=axis, comm=comm))
    blocks = blocks_to_front(x, axis, comm.size)  # block r along the leading axis
    return reduce_scatter_p.bind(blocks, comm=_group(comm), op=op)


def broadcast(x, root=0, *, comm=None):
    """Every rank gets `root`'s `x`; elsewhere `x` only gives the shape and
    dtype. Differentiable: the root's cotangent is the sum of every rank's."""
    comm = _communicator(comm)
    root = operator.index(root)
    if _eagerly(x):
        return jnp.asarray(collectives.broadcast(np.asarray(x), root, comm=comm))
    return broadcast_p.bind(jnp.asarray(x), comm=_group(comm), root=root)
