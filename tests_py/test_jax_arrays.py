"""JAX arrays are immutable and never written: out= or an in-place
collective on one is refused before any communication, out-of-place
results are new JAX arrays, and gradient synchronisation and optimizer
steps return new arrays, leaving their inputs (and every JAX array sharing
their memory) as they were."""

import numpy as np
import optree
import pytest

import concord as cc
from concord import optim
from concord.data_parallel import replicate_params, sync_gradients
from concord.training import GradientSynchronizer, train_step

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

pytestmark = pytest.mark.jax


def _shared(x):
    """A JAX array sharing `x`'s memory (JAX's reshape to the same shape is
    the same buffer), to see whether anything wrote `x`."""
    keep = x.reshape(x.shape)
    assert keep.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
    return keep


def _unchanged(pairs):
    """The (array, its value before) pairs whose array changed."""
    return [before for array, before in pairs if not np.array_equal(np.asarray(array), before)]


def test_out_and_in_place_are_refused_before_communicating(thread_ranks):
    def rank_main(comm):
        x = jnp.arange(4.0) + comm.rank
        out = jnp.zeros(4)
        keep = _shared(out)
        calls = {
            "all_reduce out": lambda: cc.all_reduce(x, comm=comm, out=out),
            "all_reduce in place": lambda: cc.all_reduce(x, comm=comm, out=x),
            "broadcast out": lambda: cc.broadcast(x, comm=comm, out=out),
            "broadcast in place": lambda: cc.broadcast(x, comm=comm, out=x),
            "all_gather out": lambda: cc.all_gather(x, comm=comm, out=jnp.zeros(8)),
            "reduce_scatter out": lambda: cc.reduce_scatter(x, comm=comm, out=jnp.zeros(2)),
            "async": lambda: cc.all_reduce(x, comm=comm, out=out, async_op=True),
        }
        messages = {}
        for name, call in calls.items():
            with pytest.raises(cc.InvalidArgumentError) as info:
                call()
            messages[name] = str(info.value)
        # Nothing travelled: the ranks are still in step.
        total = cc.all_reduce(np.ones(1), comm=comm).tolist()
        return messages, total, np.asarray(keep).tolist(), np.asarray(x).tolist()

    for rank, (messages, total, keep, x) in enumerate(thread_ranks(2, rank_main)):
        for name, message in messages.items():
            assert message == ("out is a JAX array, which is immutable: concord never writes one "
                               "(other JAX arrays may share its memory); leave out= unset and "
                               "use the array returned"), name
        assert total == [2.0] and keep == [0.0] * 4
        assert x == [float(i + rank) for i in range(4)]


def test_out_of_place_results_are_new_jax_arrays(thread_ranks, rng):
    data = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(2)]

    def rank_main(comm):
        x = jnp.asarray(data[comm.rank])
        keep = _shared(x)
        results = {
            "sum": cc.all_reduce(x, comm=comm),
            "max": cc.all_reduce(x, "max", comm=comm, async_op=True).wait(),
            "gather": cc.all_gather(x, axis=1, comm=comm),
            "scatter": cc.reduce_scatter(x, comm=comm),
            "broadcast": cc.broadcast(x, root=1, comm=comm),
        }
        fresh = all(isinstance(r, jax.Array) and r.unsafe_buffer_pointer() not in (
            x.unsafe_buffer_pointer(),) for r in results.values())
        return ({k: np.asarray(v) for k, v in results.items()}, fresh,
                _unchanged([(x, data[comm.rank]), (keep, data[comm.rank])]))

    for rank, (results, fresh, changed) in enumerate(thread_ranks(2, rank_main)):
        assert fresh and changed == []
        np.testing.assert_allclose(results["sum"], data[0] + data[1], rtol=1e-6)
        np.testing.assert_array_equal(results["max"], np.maximum(data[0], data[1]))
        np.testing.assert_array_equal(results["gather"], np.concatenate(data, axis=1))
        np.testing.assert_allclose(results["scatter"], (data[0] + data[1])[2 * rank:2 * rank + 2],
                                   rtol=1e-6)
        np.testing.assert_array_equal(results["broadcast"], data[1])


def _grads(rng_values, rank):
    return {"w": jnp.asarray(rng_values[rank]["w"]), "b": jnp.asarray(rng_values[rank]["b"])}


def test_gradient_synchronisation_returns_new_arrays(thread_ranks, rng):
    values = [{"w": rng.standard_normal((3, 5)).astype(np.float32),
               "b": rng.standard_normal(5).astype(np.float32)} for _ in range(2)]
    mean = optree.tree_map(lambda a, b: (a + b) / 2, *values)

    def rank_main(comm):
        mine = values[comm.rank]
        params = optree.tree_map(jnp.zeros_like, _grads(values, 0))
        outcomes = []
        with GradientSynchronizer(params, comm=comm, bucket_cap_mb=1e-5) as sync:
            grads = _grads(values, comm.rank)
            keeps = optree.tree_map(_shared, grads)
            synced = sync.synchronize(grads)
            outcomes.append((synced, grads, keeps))
            grads = _grads(values, comm.rank)
            keeps = optree.tree_map(_shared, grads)
            sync.mark_ready(1, grads["w"])
            sync.mark_ready(0, grads["b"])
            outcomes.append((sync.wait(), grads, keeps))
        grads = _grads(values, comm.rank)
        keeps = optree.tree_map(_shared, grads)
        opt = optim.SGD(0.0)  # the step leaves parameters as they are: the gradients matter
        state, _ = train_step(lambda p, b: (0.0, grads), opt, {"params": params,
                                                                "opt_state": opt.init(params)},
                              np.zeros((1, 1)), sync=comm)
        outcomes.append((None, grads, keeps))
        return [(None if synced is None else optree.tree_map(np.asarray, synced),
                 _unchanged([(g, mine[k]) for k, g in grads.items()]
                            + [(k_, mine[k]) for k, k_ in keeps.items()]),
                 synced is None or all(isinstance(v, jax.Array) for v in synced.values()))
                for synced, grads, keeps in outcomes]

    for outcomes in thread_ranks(2, rank_main):
        for synced, changed, jax_arrays in outcomes:
            assert changed == [] and jax_arrays
            if synced is not None:
                for key in ("w", "b"):
                    np.testing.assert_allclose(synced[key], mean[key], rtol=1e-6)


@pytest.mark.parametrize("make", [lambda: optim.SGD(0.1, momentum=0.9, weight_decay=0.01),
                                  lambda: optim.AdamW(0.01)], ids=["sgd", "adamw"])
def test_optimizer_steps_return_new_arrays(make, rng):
    start = {"w": rng.standard_normal((4, 3)).astype(np.float32),
             "b": rng.standard_normal(3).astype(np.float32)}
    grads = [optree.tree_map(lambda p: rng.standard_normal(p.shape).astype(np.float32), start)
             for _ in range(3)]
    # The same steps on NumPy copies, updated in place, are the reference.
    reference = optree.tree_map(np.copy, start)
    numpy_opt = make()
    numpy_state = numpy_opt.init(reference)
    for g in grads:
        reference, numpy_state = numpy_opt.step(reference, g, numpy_state)

    opt = make()
    params = optree.tree_map(jnp.asarray, start)
    state = opt.init(params)
    for g in grads:
        arrays = [x for x in optree.tree_leaves((params, state)) if isinstance(x, jax.Array)]
        before = [np.asarray(x) for x in arrays]
        keeps = [_shared(x) for x in arrays]
        new_params, new_state = opt.step(params, optree.tree_map(jnp.asarray, g), state)
        assert all(isinstance(x, jax.Array) for x in optree.tree_leaves(new_params))
        assert _unchanged([*zip(arrays, before), *zip(keeps, before)]) == []
        params, state = new_params, new_state
    for key in start:
        np.testing.assert_allclose(np.asarray(params[key]), reference[key], rtol=1e-5, atol=1e-7)


def test_clip_grad_norm_refuses_jax_gradients():
    grads = {"w": jnp.ones(3)}
    with pytest.raises(cc.InvalidArgumentError, match="clip_grad_norm scales the gradients in "
                                                      "place, and JAX arrays are immutable"):
        optim.clip_grad_norm(grads, 1.0)  # before any communication: no world is needed
    np.testing.assert_array_equal(np.asarray(grads["w"]), np.ones(3))


def test_pytree_collectives_never_write_their_jax_leaves(thread_ranks):
    # One 1-D leaf per kind: JAX's concatenation of a single array is that
    # array itself, which the fused collectives must not write.
    def rank_main(comm):
        leaf = jnp.arange(5.0) * (comm.rank + 1)
        before = np.asarray(leaf)
        keep = _shared(leaf)
        replicated = replicate_params({"w": leaf}, comm, root=1)
        mesh = cc.make_mesh((comm.size,), ("data",), comm=comm)
        averaged = sync_gradients({"w": leaf}, "data", mesh=mesh)
        return (np.asarray(replicated["w"]), np.asarray(averaged["w"]),
                _unchanged([(leaf, before), (keep, before)]))

    for replicated, averaged, changed in thread_ranks(2, rank_main):
        assert changed == []
        np.testing.assert_array_equal(replicated, np.arange(5.0) * 2)
        np.testing.assert_array_equal(averaged, np.arange(5.0) * 1.5)
