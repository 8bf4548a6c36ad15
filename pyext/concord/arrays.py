"""Array-type helpers: results come back as the input's own array type.

NumPy arrays take direct paths; any other array goes through its namespace
(array-api-compat), so outputs are allocated by the input's framework on the
input's device, in any dtype it has (bfloat16 and float16 included).

JAX arrays are immutable: JAX lets arrays share a buffer (a reshape may be
the same memory), so writing one would change others, and it exports no
read-only flag that would say so. concord never writes a JAX array it was
given: ``out=`` or an in-place collective on one is refused, and work done
in place elsewhere (gradient synchronisation, optimizer steps) runs on a
new array of its library, which is returned. The only JAX arrays concord
writes are those it has just allocated itself, before returning them.
"""

import operator

import numpy as np
from array_api_compat import array_namespace, device, is_jax_array

from .errors import InvalidArgumentError


def as_array(x):
    """`x` when it is an array (NumPy or DLPack); scalars and sequences as NumPy."""
    if type(x) is np.ndarray or hasattr(x, "__dlpack__"):
        return x
    return np.asarray(x)


# The namespace depends on the array type only; looking it up once per type
# keeps array-api-compat's dispatch off the per-call path.
_namespaces = {}


def namespace(x):
    """The array-API namespace of `x` (NumPy itself for NumPy arrays)."""
    if isinstance(x, np.ndarray):
        return np
    xp = _namespaces.get(type(x))
    if xp is None:
        xp = _namespaces[type(x)] = array_namespace(x)
    return xp


# Whether arrays of a type are immutable, by type: looked up once per type.
_immutable_types = {}


def is_immutable(x):
    """Whether `x` is an array concord must never write (a JAX array)."""
    if type(x) is np.ndarray:
        return False
    immutable = _immutable_types.get(type(x))
    if immutable is None:
        immutable = _immutable_types[type(x)] = is_jax_array(x)
    return immutable


def check_writable(x, role):
    """Raises InvalidArgumentError when `x` is immutable (a JAX array)."""
    if is_immutable(x):
        raise InvalidArgumentError(
            f"{role} is a JAX array, which is immutable: concord never writes one (other JAX "
            "arrays may share its memory); leave out= unset and use the array returned")


def writable_copy(x):
    """`x` itself, or for an immutable array a new array of its library
    holding the same data, which nothing else shares: what work done in
    place may write."""
    if not is_immutable(x):
        return x
    return namespace(x).asarray(x, copy=True)


def empty_like(x):
    """An uninitialised array of `x`'s type, shape, dtype and device."""
    if type(x) is np.ndarray:
        return np.empty(x.shape, x.dtype)
    return namespace(x).empty_like(x)


def empty(x, shape):
    """An uninitialised array of `x`'s type, dtype and device."""
    if type(x) is np.ndarray:
        return np.empty(shape, x.dtype)
    return namespace(x).empty(shape, dtype=x.dtype, device=device(x))


def _type_name(array):
    cls = type(array)
    return f"{cls.__module__}.{cls.__qualname__}"


def check_out(out, x, shape):
    """Raises InvalidArgumentError unless `out` can hold a result of `shape`
    with `x`'s array type and dtype, and may be written."""
    check_writable(out, "out")
    if not (isinstance(out, np.ndarray) and isinstance(x, np.ndarray)):
        try:
            same_type = namespace(out) is namespace(x)
        except TypeError:  # not an array type array-api-compat knows
            same_type = False
        if not same_type:
            raise InvalidArgumentError(
                f"out is a {_type_name(out)} but x is a {_type_name(x)}; "
                "out must be of x's array type")
    out_shape = tuple(out.shape)
    if out_shape != shape:
        raise InvalidArgumentError(f"out has shape {out_shape}, expected {shape}")
    if out.dtype != x.dtype:
        raise InvalidArgumentError(f"out has dtype {out.dtype}, expected {x.dtype}")


def normalise_axis(axis, ndim, what):
    """`axis` in [0, ndim); negative values count from the end."""
    if not -ndim <= axis < ndim:
        raise InvalidArgumentError(f"{what}: axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim


def gathered_shape(shape, size, axis, tiled):
    """(axis, result shape) of gathering arrays of `shape` from `size`
    ranks: concatenated along `axis` when tiled, else stacked along a new
    `axis`; `axis` comes back normalised. InvalidArgumentError for an axis
    out of range, or a 0-d array to concatenate."""
    shape = tuple(shape)
    if tiled:
        if not shape:
            raise InvalidArgumentError(
                "all_gather: a 0-d x cannot be concatenated; use tiled=False to stack it")
        axis = normalise_axis(operator.index(axis), len(shape), "all_gather")
        return axis, shape[:axis] + (size * shape[axis],) + shape[axis + 1:]
    axis = normalise_axis(operator.index(axis), len(shape) + 1, "all_gather")
    return axis, shape[:axis] + (size,) + shape[axis:]


def scattered_shape(shape, size, axis):
    """(axis, result shape) of reduce-scattering an array of `shape` over
    `size` ranks, split evenly along `axis` (normalised);
    InvalidArgumentError for a 0-d array, an axis out of range or an extent
    not divisible by `size`."""
    shape = tuple(shape)
    if not shape:
        raise InvalidArgumentError("reduce_scatter: x must have at least one dimension")
    axis = normalise_axis(operator.index(axis), len(shape), "reduce_scatter")
    if shape[axis] % size:
        raise InvalidArgumentError(
            f"reduce_scatter: x.shape[{axis}] = {shape[axis]} is not divisible by the "
            f"communicator size {size}")
    return axis, shape[:axis] + (shape[axis] // size,) + shape[axis + 1:]


def blocks_to_front(x, axis, parts):
    """A contiguous array of shape (parts, ...) whose entry r is block r of
    `x` split evenly along `axis`."""
    block = x.shape[axis] // parts
    index = [slice(None)] * len(x.shape)
    blocks = []
    for r in range(parts):
        index[axis] = slice(r * block, (r + 1) * block)
        blocks.append(x[tuple(index)])
    return namespace(x).stack(blocks)


def front_to_axis(stacked, axis, tiled):
    """The entries of `stacked` (one per rank, along its leading axis)
    concatenated along `axis` when tiled, else stacked at `axis`."""
    blocks = [stacked[r, ...] for r in range(stacked.shape[0])]
    xp = namespace(stacked)
    return xp.concat(blocks, axis=axis) if tiled else xp.stack(blocks, axis=axis)
