"""Collectives over a communicator (the world one unless ``comm=`` is given).

Inputs are NumPy arrays or any object with ``__dlpack__`` (Python scalars and
sequences become NumPy arrays); results come back as the input's array type.
``out=`` receives the result in place (pass the input itself for an in-place
collective) and is returned; it may not be a JAX array (immutable: see
arrays.py), whose results are always new arrays. With ``async_op=True`` a Work is returned whose
``wait()`` gives the result. Bad arguments raise InvalidArgumentError before
any communication.
"""

from . import _world
from ._capi import check_output, numpy_out_fits
from .arrays import (
    as_array,
    blocks_to_front,
    check_out,
    check_writable,
    empty,
    empty_like,
    front_to_axis,
    gathered_shape,
    scattered_shape,
)

__all__ = ["all_gather", "all_reduce", "barrier", "broadcast", "reduce_scatter"]


# A small collective costs little more than its Python calls: NumPy
# arrays with a fitting `out` (numpy_out_fits) go straight to the handle,
# anything else through the checks below and in arrays.py.


def _handle(comm):
    return (_world.get() if comm is None else comm)._handle


def _input_and_output(x, out):
    """`x` as an array and the `out` a collective whose result has x's
    shape writes: checked, new or `x` itself."""
    x = as_array(x)
    if out is None:
        out = empty_like(x)
    elif out is not x:
        check_out(out, x, tuple(x.shape))
    else:
        check_writable(x, "out")
    return x, out


def all_reduce(x, op="sum", *, comm=None, out=None, async_op=False):
    """Every rank gets `op` ("sum", "mean", "max", "min", "prod") over all
    ranks' `x`, elementwise."""
    handle = _handle(comm)
    if out is None or out is x or not numpy_out_fits(out, x):
        x, out = _input_and_output(x, out)
    return handle.all_reduce(x, out, op, async_op)


def all_gather(x, *, axis=0, tiled=True, comm=None, out=None, async_op=False):
    """Every rank gets all ranks' `x` in rank order: concatenated along
    `axis` when tiled, else stacked along a new rank axis at `axis`."""
    handle = _handle(comm)
    if (type(axis) is int and axis == 0 and tiled is True
            and numpy_out_fits(out, x, handle.size, 1)):
        return handle.all_gather(x, out, async_op, None)
    x = as_array(x)
    shape = tuple(x.shape)
    size = handle.size
    axis, result_shape = gathered_shape(shape, size, axis, tiled)
    if out is not None:
        check_out(out, x, result_shape)
    if axis == 0:
        # Rank-order concatenation along the leading axis is exactly the
        # layout the C library writes.
        buffer = empty(x, result_shape) if out is None else out
        return handle.all_gather(x, buffer, async_op, None)

    if out is not None:
        # out is written only once the data arrived: check it can be, now.
        check_output(x, out)

    def finish(gathered):
        result = front_to_axis(gathered, axis, tiled)
        if out is None:
            return result
        out[...] = result
        return out

    return handle.all_gather(x, empty(x, (size, *shape)), async_op, finish)


def reduce_scatter(x, op="sum", *, axis=0, comm=None, out=None, async_op=False):
    """`x` split evenly along `axis` into one block per rank; rank r gets
    `op` over all ranks of block r."""
    handle = _handle(comm)
    size = handle.size
    if type(axis) is int and axis == 0 and numpy_out_fits(out, x, 1, size):
        return handle.reduce_scatter(x, out, op, async_op)
    x = as_array(x)
    axis, result_shape = scattered_shape(x.shape, size, axis)
    if out is None:
        out = empty(x, result_shape)
    else:
        check_out(out, x, result_shape)
    # The C library scatters blocks along the leading axis; other axes are
    # moved there first (a copy, freshly contiguous).
    send = x if axis == 0 else blocks_to_front(x, axis, size)
    return handle.reduce_scatter(send, out, op, async_op)


def broadcast(x, root=0, *, comm=None, out=None, async_op=False):
    """Every rank gets `root`'s `x`; on other ranks `x` only gives the shape
    and dtype (and is the buffer written when it is also `out`)."""
    handle = _handle(comm)
    if out is None or out is x or not numpy_out_fits(out, x):
        x, out = _input_and_output(x, out)
    return handle.broadcast(x, out, root, async_op)


def barrier(*, comm=None):
    """Returns once every rank reached the barrier."""
    _handle(comm).barrier()
