"""concord's collectives for JAX, inside jax.jit too.

    import concord.jax as cj

    @jax.jit
    def step(params, batch):
        grads = jax.grad(loss)(params, batch)
        return jax.tree.map(lambda g: cj.all_reduce(g, "mean"), grads)

all_reduce, all_gather, reduce_scatter and broadcast run as XLA FFI calls
(handlers.cpp) on a communicator (the world unless `comm=` is given),
inside jax.jit, lax.scan, lax.fori_loop and lax.while_loop, under jax.grad,
jax.checkpoint and jax.vmap, and on concrete arrays outside them. They
return new arrays; inputs are never written.
Every rank runs its concord collectives in program order (an ordered
effect: XLA keeps them in order and never drops one), so two ranks running
the same program always pair the same calls.

Derivatives follow jax.lax's collectives (psum, all_gather, psum_scatter;
see _primitives.py for every rule, "max", "min" and "prod" included).

Errors inside a compiled computation reach Python as JAX's
jax.errors.JaxRuntimeError, when the result is used (dispatch is
asynchronous); the message names concord's exception class
(MismatchError when ranks disagree on a collective, RemoteError when a peer
failed, ...) and carries concord's own message. Bad arguments raise
concord's InvalidArgumentError while the call is traced.
"""

from ._collectives import all_gather, all_reduce, broadcast, reduce_scatter

__all__ = ["all_gather", "all_reduce", "broadcast", "reduce_scatter"]
