"""concord's collectives as JAX primitives, in the C ABI's layout (ranks
along the leading axis): abstract evaluation, lowering to the XLA FFI
handlers, and differentiation.

Ordering: every primitive carries one ordered effect, so JAX threads a token
through all of them (inside jit, scan, while loops, and across dispatched
computations): XLA can neither drop, reorder nor overlap them, and every
rank issues them in program order.

Under jax.vmap the batch axis is one more axis of the arrays: every rank
must map over the same sizes.

Differentiation follows jax.lax's collectives, whose SPMD reading is that
the program's result is the sum of what every rank computes: all_reduce
with "sum" is psum (its transpose all-reduces the cotangents), "mean" is
the sum over the size; all_gather transposes to a summing reduce_scatter
(psum_scatter) and reduce_scatter with "sum" to all_gather; broadcast
transposes to the sum of the cotangents on the root (zero elsewhere).
"max" and "min" (where jax.lax's pmax and pmin have no rule) follow
jnp.max's: the tangent of the rank holding the extreme, averaged over tied
ranks; "prod" is each rank's tangent times the product of the other ranks'
values. Those rules are written with the linear collectives, so reverse
mode comes from the same transposes.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import effects  # declaring an ordered effect has no public API yet
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir, xla

from .._constants import REDUCE_OPS
from ._library import PLATFORMS, target

try:
    from jax.ffi import abstract_token
except ImportError:  # before jax 0.11
    from jax._src.core import abstract_token

__all__ = ["Group", "all_gather_p", "all_reduce_p", "broadcast_p", "reduce_scatter_p"]


@dataclasses.dataclass(frozen=True)
class Group:
    """A communicator as the primitives see it: the id the handlers know it
    by, this process's rank in it, and its size (static: they shape the
    results and the derivatives)."""

    id: int
    rank: int
    size: int


@dataclasses.dataclass(frozen=True)
class CollectiveEffect(effects.Effect):
    """A concord collective: ordered, allowed in control flow, custom
    derivatives and rematerialisation (each replays the same collectives on
    every rank)."""

    def __str__(self):
        return "concord collective"


EFFECT = CollectiveEffect()
for _kinds in (effects.lowerable_effects, effects.ordered_effects,
               effects.control_flow_allowed_effects, effects.custom_derivatives_allowed_effects,
               effects.remat_allowed_effects):
    _kinds.add_type(CollectiveEffect)

LINEAR_OPS = ("sum", "mean")

all_reduce_p = Primitive("concord_all_reduce")    # x -> op over ranks of x
all_gather_p = Primitive("concord_all_gather")    # x -> (size, *x.shape)
reduce_scatter_p = Primitive("concord_reduce_scatter")  # (size, *b) -> op over ranks of block rank
broadcast_p = Primitive("concord_broadcast")      # x -> root's x


# ---- evaluation ------------------------------------------------------------------

@all_reduce_p.def_effectful_abstract_eval
def _all_reduce_abstract(x, *, comm, op):
    return x.update(), {EFFECT}


@all_gather_p.def_effectful_abstract_eval
def _all_gather_abstract(x, *, comm):
    return x.update(shape=(comm.size, *x.shape)), {EFFECT}


@reduce_scatter_p.def_effectful_abstract_eval
def _reduce_scatter_abstract(x, *, comm, op):
    return x.update(shape=x.shape[1:]), {EFFECT}


@broadcast_p.def_effectful_abstract_eval
def _broadcast_abstract(x, *, comm, root):
    return x.update(), {EFFECT}


for _primitive in (all_reduce_p, all_gather_p, reduce_scatter_p, broadcast_p):
    # Outside jit a primitive runs as a computation of its own, through the
    # same handlers (and the same token, so it stays in order with the rest).
    _primitive.def_impl(functools.partial(xla.apply_primitive, _primitive))


# ---- lowering --------------------------------------------------------------------

def _attributes(comm, op=None, root=None):
    attributes = {"comm": np.int64(comm.id)}
    if op is not None:
        attributes["op"] = np.int32(REDUCE_OPS[op])
    if root is not None:
        attributes["root"] = np.int32(root)
    return attributes


def _lower(name, in_place, ctx, x, *, comm, **params):
    """The handler's custom call, with the effect's token in and out. With
    `in_place` its result takes the operand's buffer: XLA copies the operand
    first only when something still reads it (a JAX array never changes),
    so a loop's carry, or gradients, are reduced where they are instead of
    into fresh memory on every call."""
    with_token = ctx.replace(avals_in=[*ctx.avals_in, abstract_token],
                             avals_out=[*ctx.avals_out, abstract_token])
    call = jax.ffi.ffi_lowering(name, has_side_effect=True,
                                operand_output_aliases={0: 0} if in_place else None)
    result, token = call(with_token, x, ctx.tokens_in.get(EFFECT), **_attributes(comm, **params))
    ctx.set_tokens_out(mlir.TokenSet({EFFECT: token}))
    return [result]


def _register_lowering(primitive, collective, in_place):
    for platform in PLATFORMS:
        mlir.register_lowering(
            primitive, functools.partial(_lower, target(collective, platform), in_place),
            platform=platform)


_register_lowering(all_reduce_p, "all_reduce", in_place=True)
_register_lowering(all_gather_p, "all_gather", in_place=False)
_register_lowering(reduce_scatter_p, "reduce_scatter", in_place=False)
_register_lowering(broadcast_p, "broadcast", in_place=True)


# ---- differentiation ----------------------------------------------------------------

def _nonlinear_tangent(x, y_full, t, reduce, comm, op):
    """The tangent of op ("max", "min", "prod") over ranks, written with
    `reduce(v, "sum")`, the summing form of the collective (all_reduce, or
    reduce_scatter), so that it is linear in `t`. `y_full` is the
    collective's result laid out as `x` (every block's, for a scatter)."""
    if op == "prod":
        gathered = all_gather_p.bind(x, comm=comm)  # every rank's x, along a new leading axis
        others = jnp.prod(gathered.at[comm.rank].set(1), axis=0)
        return reduce(others * t, "sum")
    holds = x == y_full  # this rank holds the extreme
    ties = reduce(holds.astype(t.dtype), "sum")
    return reduce(jnp.where(holds, t, jnp.zeros_like(t)), "sum") / ties


def _reduction_jvp(primitive, laid_out_as_x, primals, tangents, *, comm, op):
    """The JVP of all_reduce or reduce_scatter (`primitive`);
    laid_out_as_x(y, comm) is its result laid out as its input."""
    (x,), (t,) = primals, tangents
    y = primitive.bind(x, comm=comm, op=op)
    if op in LINEAR_OPS:
        return y, primitive.bind(t, comm=comm, op=op)

    def reduce(v, how):
        return primitive.bind(v, comm=comm, op=how)
    return y, _nonlinear_tangent(x, laid_out_as_x(y, comm), t, reduce, comm, op)


def _all_reduce_transpose(ct, x, *, comm, op):
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [all_reduce_p.bind(ct, comm=comm, op=op)]  # only sum and mean are linear


def _reduce_scatter_transpose(ct, x, *, comm, op):
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    gathered = all_gather_p.bind(ct, comm=comm)
    return [gathered / comm.size if op == "mean" else gathered]


def _all_gather_transpose(ct, x, *, comm):
    return [reduce_scatter_p.bind(ct, comm=comm, op="sum")]


def _broadcast_transpose(ct, x, *, comm, root):
    total = all_reduce_p.bind(ct, comm=comm, op="sum")
    return [total if comm.rank == root else jnp.zeros_like(total)]


ad.primitive_jvps[all_reduce_p] = functools.partial(_reduction_jvp, all_reduce_p,
                                                    lambda y, comm: y)
ad.primitive_transposes[all_reduce_p] = _all_reduce_transpose
ad.primitive_jvps[reduce_scatter_p] = functools.partial(
    _reduction_jvp, reduce_scatter_p, lambda y, comm: all_gather_p.bind(y, comm=comm))
ad.primitive_transposes[reduce_scatter_p] = _reduce_scatter_transpose
ad.deflinear2(all_gather_p, _all_gather_transpose)
ad.deflinear2(broadcast_p, _broadcast_transpose)


# ---- batching ---------------------------------------------------------------------

def _elementwise_batcher(primitive, args, dims, **params):
    (x,), (d,) = args, dims
    return primitive.bind(x, **params), d


def _all_gather_batcher(args, dims, *, comm):
    (x,), (d,) = args, dims
    return all_gather_p.bind(x, comm=comm), d + 1  # behind the new rank axis


def _reduce_scatter_batcher(args, dims, *, comm, op):
    (x,), (d,) = args, dims
    if d == 0:  # the leading axis holds the ranks' blocks: the batch goes behind it
        x, d = jnp.moveaxis(x, 0, 1), 1
    return reduce_scatter_p.bind(x, comm=comm, op=op), d - 1


batching.primitive_batchers[all_reduce_p] = functools.partial(_elementwise_batcher, all_reduce_p)
batching.primitive_batchers[broadcast_p] = functools.partial(_elementwise_batcher, broadcast_p)
batching.primitive_batchers[all_gather_p] = _all_gather_batcher
batching.primitive_batchers[reduce_scatter_p] = _reduce_scatter_batcher
