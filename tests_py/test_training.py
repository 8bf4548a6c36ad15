"""GradientSynchronizer and train_step: data-parallel training on N ranks
equals one process on the global batch.

Multi-rank checks run in one concord.launch job per world size (starting
ranks is the cost); each rank runs every case and returns the failures it
saw. The model is a small NumPy MLP with a hand-written backward; every rank
draws the same global batches and takes its contiguous shard, and also
computes the one-process reference itself.
"""

import numpy as np
import optree
import pytest

import concord as cc
from concord import optim
from concord.errors import InvalidArgumentError
from concord.sharded import ShardedArray
from concord.training import GradientSynchronizer, train_step

GLOBAL_BATCH = 12  # divisible by 1, 2, 3 and 4
STEPS = 5
SEED = 7
# Exact synchronisation: float32 sums in another order than one process's.
EXACT = dict(rtol=2e-5, atol=2e-6)
# bf16 on the wire: each synchronised gradient is within 2**-7 times the
# mean of |grad| over ranks (the C ABI's bound). After 5 steps (SGD lr 0.05,
# AdamW lr 0.01) parameters that moved by about 0.05-0.15 stay within 2e-3 of
# the exact run (about 3e-4 is typical).
BF16_PARAMS_ATOL = 2e-3
BF16_GRAD_BOUND = 2.0 ** -7
FP16_GRAD_BOUND = 2.0 ** -10

SIZES = (6, 16, 8, 3)  # input, two hidden layers, output


def init_params(seed=SEED):
    """Layers of different sizes, so bucket caps group them differently."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        params.append({"w": (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in))
                       .astype(np.float32),
                       "b": (0.1 * rng.standard_normal(fan_out)).astype(np.float32)})
    return params


def global_batch(step):
    rng = np.random.default_rng([SEED, step])
    x = rng.standard_normal((GLOBAL_BATCH, SIZES[0])).astype(np.float32)
    y = rng.standard_normal((GLOBAL_BATCH, SIZES[-1])).astype(np.float32)
    return x, y


def shard(batch, rank, size):
    per_rank = GLOBAL_BATCH // size
    return tuple(a[rank * per_rank:(rank + 1) * per_rank] for a in batch)


def grad_fn(params, batch):
    """Mean squared error of a ReLU MLP over the batch, and its gradients."""
    x, y = batch
    activations = [x]
    for layer in params[:-1]:
        activations.append(np.maximum(activations[-1] @ layer["w"] + layer["b"], 0))
    out = activations[-1] @ params[-1]["w"] + params[-1]["b"]
    diff = out - y
    loss = 0.5 * float(np.mean(np.sum(diff * diff, axis=1)))
    delta = diff / np.float32(len(x))
    grads = [None] * len(params)
    for i in reversed(range(len(params))):
        grads[i] = {"w": activations[i].T @ delta, "b": delta.sum(axis=0)}
        if i:
            delta = (delta @ params[i]["w"].T) * (activations[i] > 0)
    return loss, grads


OPTIMIZERS = {
    "sgd": lambda: optim.SGD(0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adamw": lambda: optim.AdamW(1e-2, weight_decay=0.01),
}


def leaf_nbytes():
    return [x.nbytes for x in optree.tree_leaves(init_params())]


def bucket_configs():
    """(name, bucket options, expected bucket count): one gradient per
    bucket, a few per bucket, one bucket for all."""
    nbytes = leaf_nbytes()
    middle = 2 * max(nbytes) / 2**20
    return [("per-tensor", dict(bucket_cap_mb=1e-9, first_bucket_mb=1e-9), len(nbytes)),
            ("middle", dict(bucket_cap_mb=middle, first_bucket_mb=middle / 2), None),
            ("one", dict(bucket_cap_mb=100, first_bucket_mb=100), 1)]


def reference_run(make_optimizer):
    """One process on the global batches: (params after STEPS, losses)."""
    params = init_params()
    opt = make_optimizer()
    state = opt.init(params)
    losses = []
    for step in range(STEPS):
        loss, grads = grad_fn(params, global_batch(step))
        params, state = opt.step(params, grads, state)
        losses.append(loss)
    return params, losses


def data_parallel_run(make_optimizer, sync_factory, rank, size):
    """train_step on this rank's shards: (params after STEPS, losses)."""
    params = init_params()
    opt = make_optimizer()
    state = {"params": params, "opt_state": opt.init(params)}
    sync = sync_factory(params)
    losses = []
    for step in range(STEPS):
        state, metrics = train_step(grad_fn, opt, state, shard(global_batch(step), rank, size),
                                    sync=sync)
        losses.append(metrics["loss"])
    if isinstance(sync, GradientSynchronizer):
        sync.close()
    return state["params"], losses


def max_difference(got, expected):
    return max(float(np.max(np.abs(a - b), initial=0.0))
               for a, b in zip(optree.tree_leaves(got), optree.tree_leaves(expected)))


def trees_close(got, expected, **tolerance):
    return all(np.allclose(a, b, **tolerance)
               for a, b in zip(optree.tree_leaves(got), optree.tree_leaves(expected)))


def check_training(failures, rank, size):
    """Every optimizer x sync variant equals the one-process run, losses
    included."""
    for opt_name, make_optimizer in OPTIMIZERS.items():
        expected, expected_losses = reference_run(make_optimizer)
        variants = [(f"buckets {name}", _bucketed(options, count, failures, opt_name, name))
                    for name, options, count in bucket_configs()]
        variants.append(("sync=True", lambda params: True))
        variants.append(("sync=world", lambda params: cc.world()))
        for variant, factory in variants:
            params, losses = data_parallel_run(make_optimizer, factory, rank, size)
            if not trees_close(params, expected, **EXACT):
                failures.append(f"{opt_name} {variant}: params differ from one process by "
                                f"{max_difference(params, expected):.3g}")
            if not np.allclose(losses, expected_losses, rtol=1e-5):
                failures.append(f"{opt_name} {variant}: losses {losses} != {expected_losses}")


def _bucketed(options, expected_count, failures, opt_name, name):
    def factory(params):
        sync = GradientSynchronizer(params, **options)
        if expected_count is not None and sync.num_buckets != expected_count:
            failures.append(f"{opt_name} buckets {name}: {sync.num_buckets} buckets, "
                            f"expected {expected_count}")
        return sync
    return factory


def check_mark_ready_in_any_order(failures, rank, size):
    """mark_ready in a custom order (with a matching ready_order plan) and
    wait() give the mean of every rank's gradients."""
    rng = np.random.default_rng([SEED, 99])
    per_rank = [[rng.standard_normal(n).astype(np.float32) for n in (5, 1000, 17, 0, 301)]
                for _ in range(size)]
    order = [2, 0, 4, 1, 3]
    grads = [g.copy() for g in per_rank[rank]]
    with GradientSynchronizer(grads, bucket_cap_mb=0.002, first_bucket_mb=1e-9,
                              ready_order=order) as sync:
        for index in order:
            sync.mark_ready(index, grads[index])
        result = sync.wait()
    for i, got in enumerate(result):
        expected = np.mean([g[i] for g in per_rank], axis=0)
        if got is not grads[i] or not np.allclose(got, expected, **EXACT):
            failures.append(f"mark_ready order {order}: gradient {i} wrong")


def check_compression(failures, rank, size):
    """Each synchronised gradient within the documented bound, and SGD
    trained with bf16 gradients close to the exact run."""
    rng = np.random.default_rng([SEED, 123])
    per_rank = [rng.standard_normal(10007).astype(np.float32) * 3 for _ in range(size)]
    exact = np.mean(np.stack(per_rank).astype(np.float64), axis=0)
    magnitude = np.mean(np.abs(np.stack(per_rank).astype(np.float64)), axis=0)
    for compress, bound, absolute in (("bf16", BF16_GRAD_BOUND, 0.0),
                                      ("fp16", FP16_GRAD_BOUND, 2.0 ** -24)):
        grad = per_rank[rank].copy()
        with GradientSynchronizer([grad], compress=compress) as sync:
            sync.synchronize([grad])
        excess = np.abs(grad - exact) - (bound * magnitude + absolute) * (1 + 1e-6)
        if excess.max() > 0:
            failures.append(f"{compress}: gradient error exceeds the bound by {excess.max():.3g}")
        if size > 1 and np.array_equal(grad, exact.astype(np.float32)):
            failures.append(f"{compress}: no rounding visible, was compression applied?")
    for opt_name, make_optimizer in OPTIMIZERS.items():
        params, _ = data_parallel_run(
            make_optimizer, lambda p: GradientSynchronizer(p, compress="bf16"), rank, size)
        difference = max_difference(params, reference_run(make_optimizer)[0])
        if difference > BF16_PARAMS_ATOL:
            failures.append(f"bf16 {opt_name}: params differ from the exact run by "
                            f"{difference:.3g}")


def check_global_mean_loss(failures, rank, size):
    """Rank r has r + 1 samples with loss r + 1: the sample-weighted mean."""
    params = [np.zeros(2, np.float32)]
    opt = optim.SGD(0.0)
    state = {"params": params, "opt_state": opt.init(params), "epoch": 3}
    batch = {"x": np.zeros((rank + 1, 4))}
    new_state, metrics = train_step(lambda p, b: (np.float32(rank + 1), [np.ones(2, np.float32)]),
                                    opt, state, batch, sync=True)
    expected = sum((r + 1) ** 2 for r in range(size)) / sum(r + 1 for r in range(size))
    if metrics["loss"] != pytest.approx(expected) or not isinstance(metrics["loss"], float):
        failures.append(f"global mean loss {metrics['loss']!r}, expected {expected}")
    if new_state["epoch"] != 3 or new_state["opt_state"]["step"] != 1:
        failures.append(f"train_step lost state keys: {sorted(new_state)}")


def _clip_sharded(failures, what, rank_in_axis, axis_size, axis_name, seed):
    """clip_grad_norm on a gradient sharded over an axis plus a replicated
    one equals NumPy on the full arrays."""
    rng = np.random.default_rng([SEED, seed])
    full = rng.standard_normal((3 * axis_size, 5)).astype(np.float32)
    replicated = rng.standard_normal(7).astype(np.float32)
    block = slice(3 * rank_in_axis, 3 * (rank_in_axis + 1))
    grads = {"a": ShardedArray(full[block].copy(), full.shape, 0, axis_name),
             "b": replicated.copy()}
    expected = float(np.sqrt(np.sum(full.astype(np.float64) ** 2)
                             + np.sum(replicated.astype(np.float64) ** 2)))
    norm = optim.clip_grad_norm(grads, 1.0)
    coefficient = 1.0 / (expected + 1e-6)
    if norm != pytest.approx(expected, rel=1e-9):
        failures.append(f"clip_grad_norm {what}: norm {norm}, expected {expected}")
    if not (np.allclose(grads["a"].local, full[block] * coefficient, rtol=1e-6)
            and np.allclose(grads["b"], replicated * coefficient, rtol=1e-6)):
        failures.append(f"clip_grad_norm {what}: gradients not scaled by {coefficient}")


def check_clip_grad_norm_sharded(failures, rank, size):
    _clip_sharded(failures, "over the world", rank, size, "data", 0)
    if size == 4:
        mesh = cc.make_mesh((2, 2), ("data", "fsdp"))
        with cc.use_mesh(mesh):
            # Each data row holds other values; the norm covers its own row.
            _clip_sharded(failures, "over the fsdp axis of a 2x2 mesh",
                          mesh.coords["fsdp"], 2, "fsdp", 1 + mesh.coords["data"])


def _rank_main(size):
    cc.init(timeout=60.0)
    rank = cc.rank()
    failures = []
    for check in (check_training, check_mark_ready_in_any_order, check_compression,
                  check_global_mean_loss, check_clip_grad_norm_sharded):
        check(failures, rank, size)
    cc.shutdown()
    return failures


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_data_parallel_equals_one_process(nprocs):
    results = cc.launch(_rank_main, nprocs, nprocs)
    assert results == [[]] * nprocs


def _plans_differ():
    cc.init(timeout=30.0)
    shapes = [(4,), (5,)] if cc.rank() == 0 else [(4,), (6,)]
    try:
        GradientSynchronizer([np.zeros(s, np.float32) for s in shapes])
    except cc.MismatchError as exc:
        return str(exc)
    finally:
        cc.shutdown()
    return None


def test_different_plans_on_ranks_raise_mismatch_error():
    messages = cc.launch(_plans_differ, 2)
    assert all(messages), messages


# ---- errors, in a world of one ------------------------------------------------


# Checked once, by the C library (or the one table of names it reads).
@pytest.mark.parametrize("options, message", [
    (dict(reduce="median"), "unknown op 'median'"),
    (dict(reduce=None), "unknown op None"),
    (dict(reduce="max"), "GradientSynchronizer: op must be mean or sum, got max"),
    (dict(compress="int8"), "compress must be one of None, 'bf16', 'fp16', got 'int8'"),
    (dict(compress=["bf16"]), "compress must be one of None, 'bf16', 'fp16'"),
    (dict(bucket_cap_mb=0), "bucket_cap_mb must be finite and > 0"),
    (dict(first_bucket_mb=-1), "first_bucket_mb must be finite and > 0"),
    (dict(ready_order=[0, 0]), "ready_order holds 0 twice"),
    (dict(ready_order=[0, 2]), r"ready_order holds 2, outside \[0, 2\)"),
    (dict(ready_order=[0]), "ready_order must list 2 indices"),
])
def test_synchronizer_bad_options_raise_value_error(world1, options, message):
    with pytest.raises(InvalidArgumentError, match=message):
        GradientSynchronizer([np.ones(3, np.float32), np.ones(2, np.float32)], **options)


def test_synchronizer_accepts_reduce_in_any_case(world1):
    grads = [np.full(3, 2.0, np.float32)]
    with GradientSynchronizer(grads, reduce="SUM") as sync:
        np.testing.assert_array_equal(sync.synchronize(grads)[0], np.full(3, 2.0))


def test_synchronizer_needs_leaves(world1):
    with pytest.raises(ValueError, match="params has no array leaves"):
        GradientSynchronizer({"a": None})


def test_synchronizer_misuse_raises_value_error(world1):
    params = {"w": np.ones((2, 3), np.float32), "b": np.ones(3, np.float32)}
    with GradientSynchronizer(params) as sync:
        with pytest.raises(InvalidArgumentError, match=r"gradient index 2 is outside \[0, 2\)"):
            sync.mark_ready(2, np.ones(3, np.float32))
        with pytest.raises(InvalidArgumentError, match=r"gradient index -1 is outside \[0, 2\)"):
            sync.mark_ready(-1, np.ones(3, np.float32))
        with pytest.raises(InvalidArgumentError, match=r"gradient index 5 is outside \[0, 2\)"):
            sync.bucket_of(5)
        with pytest.raises(ValueError, match="shape"):
            sync.mark_ready(0, np.ones(4, np.float32))
        with pytest.raises(ValueError, match="grads must have the structure of params"):
            sync.synchronize({"w": params["w"]})
        sync.mark_ready(0, params["b"])
        with pytest.raises(ValueError):
            sync.mark_ready(0, params["b"])
        with pytest.raises(ValueError, match="1"):  # names the gradient not marked
            sync.wait()
        sync.mark_ready(1, params["w"])
        result = sync.wait()
        assert result["b"] is params["b"] and result["w"] is params["w"]


def test_synchronizer_plans_buckets(world1):
    leaves = [np.ones(n, np.float32) for n in (1000, 10, 2000, 5)]
    with GradientSynchronizer(leaves, bucket_cap_mb=1e-9, first_bucket_mb=1e-9) as sync:
        assert sync.num_buckets == 4
        # Default ready order: reverse leaf order, as backward produces them.
        assert [sync.bucket_of(i) for i in range(4)] == [3, 2, 1, 0]
    with GradientSynchronizer(leaves, bucket_cap_mb=100) as sync:
        assert sync.num_buckets == 1


def test_train_step_rejects_an_unknown_sync(world1):
    params = [np.zeros(2, np.float32)]
    opt = optim.SGD(0.1)
    with pytest.raises(TypeError, match="sync must be a GradientSynchronizer"):
        train_step(lambda p, b: (0.0, [np.ones(2, np.float32)]), opt,
                   {"params": params, "opt_state": opt.init(params)}, np.zeros((2, 1)),
                   sync="yes")
