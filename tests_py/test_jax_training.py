"""Data-parallel training of JAX code through concord, inside jax.jit, and
the seeds' pytree functions handed JAX tracers.

A small MLP trained for a few steps on 3 ranks, each on its third of a
global batch, with the gradient mean a concord all-reduce inside the
compiled step: every rank must end with the same parameters, those of one
process trained on the whole batch (computed here, without concord). The
step is written five ways: plain concord.jax, the seeds'
reduce_gradients_across_devices, spmd_train_step inside the caller's jit,
and data_parallel_train_step with no mesh and on a mesh without its
default axis "batch".
"""

from typing import Any, NamedTuple

import numpy as np
import pytest

import concord as cc
from concord import data_parallel, metrics

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import concord.jax as cj  # noqa: E402
from concord.jax import _library  # noqa: E402

pytestmark = pytest.mark.skipif(_library.problem() is not None,
                                reason=f"concord.jax's handlers: {_library.problem()}")

RANKS = 3
BATCH = 4 * RANKS
STEPS = 5
LEARNING_RATE = 0.1
# The default axis "batch" on a mesh without it is the whole mesh.
ON_A_MESH = "data_parallel_train_step on a mesh without 'batch'"
VARIANTS = ("concord.jax", "reduce_gradients_across_devices", "spmd_train_step",
            "data_parallel_train_step", ON_A_MESH)


def join_world():
    jax.config.update("jax_platforms", "cpu")
    return cc.init(timeout=120.0)


# ---- the model, the data and an optax-style optimizer -----------------------------------------

def problem(seed):
    """The initial parameters and the global batch, the same on every rank."""
    rng = np.random.default_rng(seed)
    params = {"w1": rng.normal(size=(4, 8)) * 0.5, "b1": np.zeros(8),
              "w2": rng.normal(size=(8, 1)) * 0.5, "b2": np.zeros(1)}
    x = rng.normal(size=(BATCH, 4))
    y = np.sin(x.sum(axis=1, keepdims=True))
    as32 = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    return as32, jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)


def loss(params, batch):
    x, y = batch
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


def shard(batch, rank):
    rows = slice(rank * (BATCH // RANKS), (rank + 1) * (BATCH // RANKS))
    return tuple(part[rows] for part in batch)


class Sgd(NamedTuple):
    """Plain SGD in optax's protocol (init, update -> (updates, state))."""

    lr: float

    def init(self, params):
        return ()

    def update(self, grads, state, params=None):
        return jax.tree.map(lambda g: -self.lr * g, grads), state


class TrainState(NamedTuple):
    """What datarax's step expects of a state (a flax TrainState, say)."""

    step: Any
    params: Any
    opt_state: Any

    def replace(self, **changes):
        return self._replace(**changes)


def sgd_step(params, grads):
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)


# ---- the rank side -----------------------------------------------------------------------------

def train(variant, params, batch):
    """STEPS steps of one variant on this rank's shard; the final params."""
    if variant == ON_A_MESH:
        with cc.use_mesh(cc.make_mesh((1, RANKS), ("model", "data"))):
            return train("data_parallel_train_step", params, batch)
    optimizer = Sgd(LEARNING_RATE)
    if variant == "data_parallel_train_step":
        def loss_fn(variables, batch, rngs=None):
            return loss(variables["params"], batch)
        state = TrainState(0, params, optimizer.init(params))
        for _ in range(STEPS):
            state, _ = data_parallel.data_parallel_train_step(loss_fn, optimizer, batch, state)
        assert int(state.step) == STEPS
        return state.params

    @jax.jit
    def step(params):
        if variant == "spmd_train_step":
            _, params, _ = data_parallel.spmd_train_step(params, optimizer, loss, batch, ())
            return params
        grads = jax.grad(loss)(params, batch)
        if variant == "concord.jax":
            grads = jax.tree.map(lambda g: cj.all_reduce(g, "mean"), grads)
        else:
            grads = data_parallel.reduce_gradients_across_devices(grads, "mean", "batch")
        return sgd_step(params, grads)

    for _ in range(STEPS):
        params = step(params)
    return params


def as_lists(params):
    return {name: np.asarray(value).tolist() for name, value in params.items()}


def data_parallel_training(seed):
    """Every variant's final params on this rank, and those of training on
    the whole batch in this process alone (no collective)."""
    join_world()
    params, *batch = problem(seed)
    mine = shard(tuple(batch), cc.rank())
    results = {variant: as_lists(train(variant, params, mine)) for variant in VARIANTS}
    alone = params
    for _ in range(STEPS):
        alone = sgd_step(alone, jax.grad(loss)(alone, tuple(batch)))
    cc.shutdown()
    return results, as_lists(alone)


def test_data_parallel_training_matches_one_process_on_the_global_batch(process_ranks, seed):
    ranks = process_ranks(RANKS, data_parallel_training, seed)
    first = ranks[0][0]
    for rank, (results, alone) in enumerate(ranks):
        for variant in VARIANTS:
            for name, value in results[variant].items():
                assert value == first[variant][name], \
                    f"{variant}: rank {rank}'s {name} differs from rank 0's"
                np.testing.assert_allclose(value, alone[name], rtol=1e-5, atol=1e-6,
                                           err_msg=f"{variant}: {name}, seed {seed}")


# ---- the seeds' functions inside jit ----------------------------------------------------------

def seeds_inside_jit(seed):
    """The seeds' reductions of pytrees of tracers; returns (name, result,
    expected) triples as lists."""
    join_world()
    r, n = cc.rank(), cc.world_size()
    rng = [np.random.default_rng([seed, q]) for q in range(n)]
    values = [{"loss": g.normal(size=3).astype(np.float32), "n": g.integers(0, 9, 2),
               "ok": g.integers(0, 2, 4).astype(bool)} for g in rng]
    mine = {k: jnp.asarray(v) for k, v in values[r].items()}
    every = {k: np.stack([v[k] for v in values]) for k in values[0]}
    checks = []

    def check(name, result, expected):
        for key in expected:
            got = np.asarray(result[key])
            checks.append([name, key, type(result[key]).__name__, str(got.dtype), got.tolist(),
                           np.asarray(expected[key]).tolist()])

    check("reduce_mean_collective", jax.jit(metrics.reduce_mean_collective)(mine),
          {"loss": every["loss"].mean(0), "n": np.trunc(every["n"].sum(0) / n),
           "ok": every["ok"].mean(0)})
    check("reduce_sum_collective", jax.jit(lambda m: metrics.reduce_sum_collective(m, "data"))(
        mine), {k: v.sum(0) for k, v in every.items()})
    check("reduce_max", jax.jit(lambda m: metrics.reduce_max(m, axis_name="batch"))(mine),
          {k: v.max(0) for k, v in every.items()})
    check("reduce_custom", jax.jit(lambda m: metrics.reduce_custom(
        m, {"loss": "sum", "n": "max", "ok": None}))(mine),
        {"loss": every["loss"].sum(0), "n": every["n"].max(0), "ok": values[r]["ok"]})
    check("all_gather", jax.jit(lambda m: metrics.all_gather(m, axis_name="batch"))(mine), every)

    grads = {"w": mine["loss"], "b": mine["loss"][:1] * 2}
    mean = {"w": every["loss"].mean(0), "b": every["loss"][:, :1].mean(0) * 2}
    total = {k: v * n for k, v in mean.items()}
    check("all_reduce_gradients", jax.jit(data_parallel.all_reduce_gradients)(grads), mean)
    check("reduce_gradient_tree", jax.jit(lambda g: data_parallel.reduce_gradient_tree(
        g, "sum"))(grads), total)
    check("DataParallel.all_reduce_gradients_static", jax.jit(
        data_parallel.DataParallel.all_reduce_gradients_static)(grads), mean)
    mesh = cc.make_mesh((n, 1), ("data", "model"))
    with cc.use_mesh(mesh):
        check("reduce_mean_collective on a mesh without 'batch'",
              jax.jit(metrics.reduce_mean_collective)(grads), mean)
        check("mesh axis data", jax.jit(lambda g: data_parallel.reduce_gradients_across_devices(
            g, "mean", "data"))(grads), mean)
        check("mesh axis model", jax.jit(lambda g: data_parallel.reduce_gradients_across_devices(
            g, "mean", "model"))(grads), {k: np.asarray(v) for k, v in grads.items()})
        check("DataParallel().reduce_gradients", jax.jit(data_parallel.DataParallel(
        ).reduce_gradients)(grads), mean)
    mesh.close()
    # Outside jit they reduce JAX arrays as before, into JAX arrays.
    check("all_reduce_gradients outside jit", data_parallel.all_reduce_gradients(grads), mean)
    check("reduce_sum outside jit", metrics.reduce_sum(mine), {k: v.sum(0) for k, v in every.items()})
    cc.shutdown()
    return checks


def test_the_seeds_reductions_accept_tracers_inside_jit_and_jax_arrays_outside(
        process_ranks, seed):
    for rank in process_ranks(2, seeds_inside_jit, seed):
        for name, key, kind, dtype, got, expected in rank:
            np.testing.assert_allclose(got, expected, rtol=1e-6,
                                       err_msg=f"{name} {key} ({dtype}), seed {seed}")
            assert kind == "ArrayImpl", (name, key, kind)
        dtypes = {(name, key): dtype for name, key, _, dtype, _, _ in rank}
        assert dtypes["reduce_mean_collective", "ok"] == "float32"  # bools averaged: floats
        assert dtypes["reduce_sum_collective", "ok"] == "int32"  # bools summed: counts
        assert dtypes["reduce_mean_collective", "n"] == "int32"  # integers keep their dtype
