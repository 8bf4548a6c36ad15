"""Data-parallel training steps of JAX code, compiled whole: each rank's
loss and gradients on its own batch, their mean over the ranks by one
concord all-reduce inside the same computation, then the optimizer's
update (optax's protocol: ``optimizer.update(grads, opt_state, params) ->
(updates, opt_state)``, the updates added to the parameters).

concord.data_parallel offers them under the seeds' names (spmd_train_step,
data_parallel_train_step).
"""

import functools

import jax
import jax.numpy as jnp

from ._trees import reduce_leaves

__all__ = ["data_parallel_train_step", "spmd_train_step"]


def _apply(params, updates):
    """params + updates, each leaf keeping its parameter's dtype."""
    return jax.tree.map(lambda p, u: jnp.asarray(p + u).astype(jnp.asarray(p).dtype),
                        params, updates)


def _mean_over_ranks(grads, loss, comm):
    """The gradients and the loss averaged over `comm`'s ranks: one
    all-reduce per dtype (the loss travels with gradients of its dtype)."""
    leaves, treedef = jax.tree.flatten(grads)
    *reduced, mean_loss = reduce_leaves([*leaves, loss], ["mean"] * (len(leaves) + 1), comm)
    return jax.tree.unflatten(treedef, reduced), mean_loss


def spmd_train_step(params, optimizer, loss_fn, batch, opt_state, comm):
    """One step inside the caller's jit: (mean loss, params, opt_state)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads, loss = _mean_over_ranks(grads, loss, comm)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return loss, _apply(params, updates), opt_state


@functools.partial(jax.jit, static_argnames=("loss_fn", "optimizer", "comm"))
def data_parallel_train_step(state, batch, rngs, *, loss_fn, optimizer, comm):
    """The whole step, compiled once per (loss_fn, optimizer, comm) and
    shapes: (new state, {"loss": mean loss})."""
    model_state = getattr(state, "model_state", None) or {}

    def loss_of(params, batch):
        return loss_fn({"params": params, **model_state}, batch, rngs=rngs)

    loss, params, opt_state = spmd_train_step(state.params, optimizer, loss_of, batch,
                                              state.opt_state, comm)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, {"loss": loss}
