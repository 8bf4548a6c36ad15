"""The call patterns of the libraries whose APIs concord offers, each written
as their users write it (positional or keyword): datarax's metric
collectives and DeviceMeshManager, artifex's DataParallel and its static
twins, xlstm-jax's parameter sharding, d9d's metric sync with its context
argument, and Metric.to(device) as torchmetrics and d9d move metrics.

Multi-rank patterns run on the ranks of one concord.launch job per case;
every rank builds every rank's data from (seed, rank, name), so the parent
computes the NumPy references itself from what the ranks return.
"""

import numpy as np
import optree
import pytest

import concord as cc
from concord import data_parallel as dp
from concord import metrics as M
from concord.data_parallel import DataParallel, ShardedArray
from concord.errors import InvalidArgumentError, UnavailableError

RANKS = 3


def data(seed, rank, name, shape, dtype="float32"):
    rng = np.random.default_rng([seed, rank, sum(map(ord, name))])
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 50, shape).astype(dtype)
    return rng.uniform(-2.0, 2.0, shape).astype(dtype)


def metric_tree(seed, rank):
    return {"loss": data(seed, rank, "loss", (3,)), "n": data(seed, rank, "n", (2,), "int64"),
            "acc": data(seed, rank, "acc", (), "float64")}


def every_rank(seed, make, nranks=RANKS):
    return [make(seed, rank) for rank in range(nranks)]


def assert_close(got, expected, tolerance=1e-6):
    got = np.asarray(got)
    assert got.shape == np.shape(expected) and got.dtype == np.asarray(expected).dtype
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


# ---- datarax: metric collectives, whose axis_name is positional ----------------

def _datarax_metrics_job(seed):
    cc.init(timeout=60.0)
    mine = metric_tree(seed, cc.rank())
    return {
        "all_gather positional": M.all_gather(mine, "batch"),
        "all_gather keyword": M.all_gather(mine, axis_name="batch"),
        "all_gather default": M.all_gather(mine),
        "mean positional": M.reduce_mean_collective(mine, "batch"),
        "mean keyword": M.reduce_mean_collective(mine, axis_name="data"),
        "sum positional": M.reduce_sum_collective(mine, "batch"),
        "custom": M.reduce_custom(mine, reduce_fn={"loss": "sum", "n": "max", "acc": None}),
        "collected": M.collect_from_devices(mine),
    }


def test_datarax_metric_collectives(seed):
    results = cc.launch(_datarax_metrics_job, RANKS, seed)
    trees = every_rank(seed, metric_tree)
    stacked = {key: np.stack([tree[key] for tree in trees]) for key in trees[0]}
    for rank, seen in enumerate(results):
        for call in ("all_gather positional", "all_gather keyword", "all_gather default"):
            for key, expected in stacked.items():
                assert_close(seen[call][key], expected)
        for call in ("mean positional", "mean keyword"):
            assert_close(seen[call]["loss"], stacked["loss"].mean(0))
            assert_close(seen[call]["acc"], stacked["acc"].mean(0), 1e-12)
            # Integer means truncate, as integer division does.
            assert_close(seen[call]["n"], np.trunc(stacked["n"].sum(0) / RANKS).astype(np.int64))
        assert_close(seen["sum positional"]["loss"], stacked["loss"].sum(0), 1e-5)
        assert_close(seen["sum positional"]["n"], stacked["n"].sum(0))
        assert_close(seen["custom"]["loss"], stacked["loss"].sum(0), 1e-5)
        assert_close(seen["custom"]["n"], stacked["n"].max(0))
        assert seen["custom"]["acc"] == trees[rank]["acc"]
        for key, expected in stacked.items():
            assert len(seen["collected"][key]) == RANKS
            for got, row in zip(seen["collected"][key], expected):
                assert_close(got, row)


# ---- datarax: DeviceMeshManager's static methods and the data-parallel functions ---

def batch_of(seed, size):
    return {"x": data(seed, 0, "x", (size, 2)), "y": np.arange(size, dtype=np.int64)}


def _datarax_data_parallel_job(seed):
    cc.init(timeout=60.0)
    mesh = dp.DeviceMeshManager.create_data_parallel_mesh()
    sharding = dp.create_data_parallel_sharding(mesh)
    grads = {"w": data(seed, cc.rank(), "gw", (4, 3))}
    state = {"w": data(seed, cc.rank(), "sw", (2, 2))}
    return {
        "mesh": (mesh.axis_names, mesh.size),
        "info": dp.DeviceMeshManager.get_mesh_info(mesh),
        "hybrid": dp.DeviceMeshManager.create_hybrid_mesh(data_parallel_size=RANKS,
                                                           model_parallel_size=1).shape,
        "model": dp.DeviceMeshManager.create_model_parallel_mesh(num_devices=RANKS).shape,
        "device mesh": dp.DeviceMeshManager.create_device_mesh({"data": RANKS}).shape,
        "devices": dp.DeviceMeshManager.create_device_mesh([("data", RANKS)],
                                                           list(range(RANKS))[::-1]).coords,
        "batch": dp.place_batch_on_shards(batch_of(seed, 2 * RANKS), sharding),
        "state": dp.place_model_state_on_shards(state, mesh),
        "mean": dp.reduce_gradients_across_devices(grads, reduce_type="mean"),
        "sum": dp.reduce_gradients_across_devices(grads, "sum"),
    }


def test_datarax_mesh_manager_on_the_class_and_data_parallel_functions(seed):
    results = cc.launch(_datarax_data_parallel_job, RANKS, seed)
    grads = [data(seed, rank, "gw", (4, 3)) for rank in range(RANKS)]
    for rank, seen in enumerate(results):
        assert seen["mesh"] == (("data",), RANKS)
        assert seen["info"] == {"total_devices": RANKS, "axes": {"data": RANKS}}
        assert seen["hybrid"] == {"data": RANKS, "model": 1}
        assert seen["model"] == {"model": RANKS}
        assert seen["device mesh"] == {"data": RANKS}
        assert seen["devices"] == {"data": RANKS - 1 - rank}
        rows = slice(2 * rank, 2 * rank + 2)
        for key, value in batch_of(seed, 2 * RANKS).items():
            assert_close(seen["batch"][key], value[rows])
        assert_close(seen["state"]["w"], data(seed, 0, "sw", (2, 2)))
        assert_close(seen["mean"]["w"], np.mean(np.stack(grads).astype(np.float64),
                                                axis=0).astype(np.float32))
        assert_close(seen["sum"]["w"], np.sum(grads, axis=0), 1e-5)


def test_mesh_manager_instances_keep_their_communicator(world1):
    manager = dp.DeviceMeshManager(world1)
    mesh = manager.create_data_parallel_mesh()
    assert manager.get_mesh_info() == {"total_devices": 1, "axes": {"data": 1}}
    assert dp.DeviceMeshManager.get_mesh_info(mesh) == manager.get_mesh_info(mesh)
    # On the class there is no last mesh: the info is the world's.
    assert dp.DeviceMeshManager.get_mesh_info() == {"total_devices": 1, "axes": {}}


# ---- artifex: DataParallel's methods and their static twins ---------------------

def _artifex_job(seed):
    cc.init(timeout=60.0)
    parallel = DataParallel()
    mesh = parallel.create_mesh()
    grads = {"w": data(seed, cc.rank(), "gw", (5,)), "b": data(seed, cc.rank(), "gb", (2,),
                                                                "float64")}
    params = {"w": data(seed, cc.rank(), "pw", (3, 2))}
    batch = batch_of(seed, 2 * RANKS)
    sharding = parallel.create_data_parallel_sharding(mesh)
    static_sharding = DataParallel.create_data_parallel_sharding_static(mesh, "data")
    return {
        "sharding": (tuple(sharding.spec), tuple(static_sharding.spec)),
        "batch": parallel.shard_batch(batch, sharding),
        "batch static": DataParallel.shard_batch_static(batch, static_sharding),
        "state": parallel.shard_model_state(params, mesh, "replicate"),
        "state static": DataParallel.shard_model_state_static(params, mesh, "replicate"),
        "replicated": parallel.replicate_params(params, mesh),
        "replicated static": DataParallel.replicate_params_static(params, mesh),
        "mean": parallel.all_reduce_gradients(grads, reduce_type="mean"),
        "sum": parallel.all_reduce_gradients(grads, "sum"),
        "mean static": DataParallel.all_reduce_gradients_static(grads),
        "sum static": DataParallel.all_reduce_gradients_static(grads, "sum", "batch"),
        "reduce static": DataParallel.reduce_gradients_static(grads, reduce_type="sum",
                                                              axis_name="batch"),
    }


def test_artifex_data_parallel_methods_and_static_twins(seed):
    results = cc.launch(_artifex_job, RANKS, seed)
    grads = [{"w": data(seed, r, "gw", (5,)), "b": data(seed, r, "gb", (2,), "float64")}
             for r in range(RANKS)]
    params0 = {"w": data(seed, 0, "pw", (3, 2))}
    for rank, seen in enumerate(results):
        assert seen["sharding"] == (("data",), ("data",))
        rows = slice(2 * rank, 2 * rank + 2)
        for call in ("batch", "batch static"):
            for key, value in batch_of(seed, 2 * RANKS).items():
                assert_close(seen[call][key], value[rows])
        for call in ("state", "state static", "replicated", "replicated static"):
            assert_close(seen[call]["w"], params0["w"])
        for key in ("w", "b"):
            stack = np.stack([g[key] for g in grads])
            mean = np.mean(stack.astype(np.float64), axis=0).astype(stack.dtype)
            for call in ("mean", "mean static"):
                assert_close(seen[call][key], mean)
            for call in ("sum", "sum static", "reduce static"):
                assert_close(seen[call][key], stack.sum(0), 1e-5)


# ---- xlstm-jax: the sharding options by position ------------------------------------

XLSTM_SHAPES = {"big": (6, 4), "tall": (3, 9), "small": (2,)}


def xlstm_params(seed):
    return {name: data(seed, 0, name, shape, "float64") for name, shape in XLSTM_SHAPES.items()}


def _xlstm_job(seed):
    cc.init(timeout=60.0)
    params = xlstm_params(seed)
    sharded = dp.shard_params(params, "fsdp", 8)  # min_weight_size by position
    x = data(seed, cc.rank(), "x", (2, 3), "float64")
    full, backward = dp.gather_array_with_mean_grads(x, 1, "fsdp", np.float32, np.float32)
    grad = data(seed, cc.rank(), "g", (2, 3 * RANKS), "float64")
    # Without grad_scatter_dtype the gradient is reduced in x's dtype, as in xlstm-jax.
    _, backward_in_x_dtype = dp.gather_array_with_mean_grads(x, 1, "fsdp", np.float32)
    grad_in_float32 = data(seed, cc.rank(), "g", (2, 3 * RANKS), "float32")
    static = DataParallel.shard_params_static(params, "fsdp", 8)
    grads = {"w": data(seed, cc.rank(), "w", (4,))}
    parallel = DataParallel()
    return {
        "sharded": optree.tree_map(lambda leaf: (leaf.dim, leaf.local)
                                   if isinstance(leaf, ShardedArray) else leaf, sharded),
        "gathered": dp.gather_params(sharded, "fsdp"),
        "gathered float32": dp.gather_params(sharded, "fsdp", np.float32),
        "gathered keywords": dp.gather_params(sharded, "fsdp", gather_dtype=np.float32,
                                              grad_scatter_dtype=np.float32),
        "gathered static": DataParallel.gather_params_static(static, "fsdp", np.float32,
                                                             np.float32),
        "method": parallel.gather_params(parallel.shard_params(params, "data", 8), "data",
                                         np.float32),
        "full": full, "grad block": backward(grad),
        "grad block in x's dtype": backward_in_x_dtype(grad_in_float32),
        "synced": dp.sync_gradients(grads, ["fsdp"]),
    }


def test_xlstm_sharding_options_by_position(seed):
    results = cc.launch(_xlstm_job, RANKS, seed)
    params = xlstm_params(seed)
    xs = [data(seed, r, "x", (2, 3), "float64") for r in range(RANKS)]
    gs = [data(seed, r, "g", (2, 3 * RANKS), "float64") for r in range(RANKS)]
    ws = [data(seed, r, "w", (4,)) for r in range(RANKS)]
    for rank, seen in enumerate(results):
        # min_weight_size=8: "small" stays whole; the others split along
        # their largest dimension divisible by 3.
        assert_close(seen["sharded"]["small"], params["small"])
        for name, dim in (("big", 0), ("tall", 1)):
            got_dim, block = seen["sharded"][name]
            size = XLSTM_SHAPES[name][dim] // RANKS
            assert got_dim == dim
            assert_close(block, np.take(params[name], range(rank * size, (rank + 1) * size),
                                        axis=dim))
        for name, value in params.items():
            assert_close(seen["gathered"][name], value)
            as_float32 = value if name == "small" else value.astype(np.float32)
            for call in ("gathered float32", "gathered keywords", "gathered static", "method"):
                assert_close(seen[call][name], as_float32)
        assert_close(seen["full"], np.concatenate(xs, axis=1).astype(np.float32))
        block = [g[:, 3 * rank:3 * rank + 3].astype(np.float32) for g in gs]
        assert_close(seen["grad block"], np.mean(np.stack(block), axis=0).astype(np.float64),
                     1e-6)
        block = [g[:, 3 * rank:3 * rank + 3].astype(np.float32).astype(np.float64) for g in gs]
        assert_close(seen["grad block in x's dtype"], np.mean(np.stack(block), axis=0), 1e-12)
        assert_close(seen["synced"]["w"], np.mean(np.stack(ws).astype(np.float64),
                                                  axis=0).astype(np.float32))


# ---- d9d: trigger_sync(dist_context) / wait_sync(dist_context) -----------------------

def _d9d_job(seed):
    world = cc.init(timeout=60.0)
    rank = cc.rank()
    values = data(seed, rank, "v", (4 + rank,), "float64")
    seen = {}
    total = M.Sum()
    total.update(values)
    total.trigger_sync(world)
    total.wait_sync(world)
    seen["sum"] = total.compute()
    collection = M.MetricCollection({"mean": M.Mean(), "max": M.Max(), "cat": M.Cat()})
    collection.update(values)
    collection.trigger_sync(world)
    # Another communicator than the sync's: refused, and the sync still pending.
    with world.split(0) as other:
        try:
            collection.wait_sync(other)
        except InvalidArgumentError as exc:
            seen["other communicator"] = str(exc)
    collection.wait_sync(world)
    seen["collection"] = collection.compute()
    # trigger_sync() with no context and wait_sync with the world's.
    more = M.Mean()
    more.update(values * 2)
    more.trigger_sync()
    more.wait_sync(cc.world())
    seen["mean of doubles"] = more.compute()
    try:
        M.Sum().trigger_sync("a context that is no communicator")
    except InvalidArgumentError as exc:
        seen["not a communicator"] = str(exc)
    return seen


def test_d9d_sync_with_the_context_on_both_calls(seed):
    results = cc.launch(_d9d_job, RANKS, seed)
    values = [data(seed, r, "v", (4 + r,), "float64") for r in range(RANKS)]
    joined = np.concatenate(values)
    for seen in results:
        assert seen["sum"] == pytest.approx(joined.sum(), rel=1e-12)
        assert seen["collection"]["mean"] == pytest.approx(joined.mean(), rel=1e-12)
        assert seen["collection"]["max"] == joined.max()
        assert_close(np.sort(seen["collection"]["cat"]), np.sort(joined))
        assert seen["mean of doubles"] == pytest.approx(2 * joined.mean(), rel=1e-12)
        assert "triggered on another communicator" in seen["other communicator"]
        assert "comm must be a concord Communicator or None (the world), got a str" in \
            seen["not a communicator"]


def test_wait_sync_with_another_communicator_leaves_the_sync_pending(world1):
    metric = M.Sum()
    metric.update(np.array([1.5, 2.0]))
    metric.trigger_sync(world1)
    with world1.split(0) as other, pytest.raises(InvalidArgumentError,
                                                 match="another communicator"):
        metric.wait_sync(other)
    with pytest.raises(RuntimeError, match="while a sync is in flight"):
        metric.compute()
    metric.wait_sync(world1)
    assert metric.compute() == 3.5


# ---- torchmetrics and d9d: Metric.to(device) ------------------------------------------

def test_metric_to_the_host_returns_the_metric_and_keeps_its_states(world1, rng):
    values = rng.normal(size=7)
    metric = M.Mean()
    assert metric.to("cpu") is metric
    assert metric._home is None  # a host target leaves a fresh metric without a home
    metric.update(values)
    assert metric.to("cpu") is metric and metric.to("cpu:0") is metric
    metric.update(values[:3])
    metric.sync()
    expected = np.concatenate([values, values[:3]]).mean()
    assert metric.compute() == pytest.approx(expected, rel=1e-12)
    collection = M.MetricCollection({"sum": M.Sum(), "cat": M.Cat()})
    collection.update(values)
    assert collection.to("cpu") is collection
    collection.sync()
    assert collection["sum"].compute() == pytest.approx(values.sum(), rel=1e-12)
    assert np.array_equal(collection["cat"].compute(), values)


def test_metric_to_a_torch_device_on_the_host(world1, rng):
    torch = pytest.importorskip("torch")
    values = rng.normal(size=6)
    metric = M.Sum()
    metric.update(torch.from_numpy(values))
    assert metric.to(torch.device("cpu")) is metric
    metric.update(torch.from_numpy(values[:2]))
    assert isinstance(metric._synced["totals"], torch.Tensor)
    assert metric.compute() == pytest.approx(values.sum() + values[:2].sum(), rel=1e-12)
    # A NumPy home stays NumPy on the host, whatever names the host.
    numpy_metric = M.Sum()
    numpy_metric.update(values)
    numpy_metric.to(torch.device("cpu"))
    numpy_metric.update(values)
    assert numpy_metric.compute() == pytest.approx(2 * values.sum(), rel=1e-12)


@pytest.mark.parametrize("device", ["tpu", "mps", "cuda:x", "cpu:", -1, 1.5, None, True])
def test_metric_to_an_unknown_device_is_a_value_error(world1, device):
    metric = M.Sum()
    metric.update(np.ones(3))
    with pytest.raises(ValueError, match=r"Metric.to: unknown device .*expected 'cpu', 'cuda'"):
        metric.to(device)
    collection = M.MetricCollection({"a": metric})
    with pytest.raises(ValueError, match="unknown device"):
        collection.to(device)
    assert metric.compute() == 3.0


def test_metric_to_a_missing_gpu_is_unavailable_and_moves_nothing(world1):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    metric = M.Sum()
    metric.update(np.ones(2))
    collection = M.MetricCollection({"a": metric, "b": M.Max()})
    for device in ("cuda", "cuda:1", 0, torch.device("cuda", 0)):
        with pytest.raises(UnavailableError, match="Metric.to: .*CUDA device.* is not there: "
                                                   "torch sees 0"):
            metric.to(device)
        with pytest.raises(UnavailableError, match="is not there"):
            collection.to(device)
    assert metric._home.name == "NumPy arrays (host)" and collection["b"]._home is None
    assert metric.compute() == 2.0


def test_metric_to_while_a_sync_is_in_flight_raises(world1):
    collection = M.MetricCollection({"a": M.Sum()})
    collection.update(np.ones(2))
    collection.trigger_sync()
    with pytest.raises(RuntimeError, match=r"to\(\) called while a sync is in flight"):
        collection.to("cpu")
    with pytest.raises(RuntimeError, match=r"to\(\) called while a sync is in flight"):
        collection["a"].to("cpu")
    collection.wait_sync()
    assert collection.compute() == {"a": 2.0}


@pytest.mark.gpu
def test_metric_to_a_gpu_and_back(world1, torch_cuda, rng):
    torch = torch_cuda
    values = rng.normal(size=9)
    metric = M.Mean()
    metric.update(values[:4])  # NumPy home, with data: copied to the GPU
    assert metric.to("cuda:0") is metric
    assert metric._synced["totals"].device == torch.device("cuda", 0)
    metric.update(torch.from_numpy(values[4:]).cuda())
    metric.sync()
    assert metric.compute() == pytest.approx(values.mean(), rel=1e-12)
    metric.to("cpu")  # torch CUDA states become torch CPU ones
    assert metric._synced["totals"].device == torch.device("cpu")
    metric.update(torch.from_numpy(values))
    assert metric.compute() == pytest.approx(values.mean(), rel=1e-12)
    fresh = M.MetricCollection({"max": M.Max(), "cat": M.Cat()}).to(0)
    fresh.update(torch.from_numpy(values).cuda())
    assert fresh["max"].compute() == values.max()
    assert np.array_equal(fresh["cat"].compute().cpu().numpy(), values)


# ---- xlstm-jax: gradients through the gathers, in grad_scatter_dtype -------------------

def xlstm_gradients(seed):
    """On each rank: the gradient of sum(full * c_rank) with respect to this
    rank's block, through gather_params and gather_array_with_mean_grads,
    eagerly and inside jax.jit."""
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_enable_x64", True)
    cc.init(timeout=120.0)
    rank = cc.rank()
    weights = data(seed, 0, "w", (6, 4), "float64")
    sharded = dp.shard_params({"w": jnp.asarray(weights)}, "fsdp", 8)["w"]
    c = jnp.asarray(data(seed, rank, "c", (6, 4), "float64"))

    def through_params(gather_dtype, scatter_dtype):
        def loss(block):
            params = {"w": sharded.replace(block), "b": jnp.ones(2)}
            full = dp.gather_params(params, "fsdp", gather_dtype, scatter_dtype)["w"]
            return jnp.sum(full * c)
        return loss

    def through_array(block):
        full, _ = dp.gather_array_with_mean_grads(block, 0, "fsdp", None, jnp.float16)
        return jnp.sum(full * c)

    def backward_inside_jit(block):
        _, backward = dp.gather_array_with_mean_grads(block, 0, "fsdp", jnp.float32)
        return backward(c)

    block = sharded.local
    results = {
        "float32": jax.grad(through_params(jnp.float32, jnp.float32))(block),
        "float32 jit": jax.jit(jax.grad(through_params(jnp.float32, jnp.float32)))(block),
        "float16 scatter": jax.jit(jax.grad(through_params(None, jnp.float16)))(block),
        "no casts": jax.grad(through_params(None, None))(block),
        "array float16 scatter": jax.jit(jax.grad(through_array))(block),
        "backward in jit": jax.jit(backward_inside_jit)(block),
        "gathered in jit": jax.jit(lambda b: dp.gather_params({"w": sharded.replace(b)},
                                                              "fsdp")["w"])(block),
    }
    cc.shutdown()
    return {key: [str(value.dtype), np.asarray(value).tolist()] for key, value in results.items()}


def _block_mean(seed, rank, dtype):
    """The mean over the ranks of every rank's c on `rank`'s rows, computed
    in `dtype` as concord's mean is (16-bit floats summed in float32)."""
    blocks = [data(seed, r, "c", (6, 4), "float64")[2 * rank:2 * rank + 2].astype(dtype)
              for r in range(RANKS)]
    wide = np.float64 if dtype == np.float64 else np.float32
    return (np.sum(np.stack(blocks).astype(wide), axis=0) / wide(RANKS)).astype(dtype)


@pytest.mark.jax
def test_xlstm_gradients_through_the_gathers_follow_grad_scatter_dtype(process_ranks, seed):
    pytest.importorskip("jax")
    from concord.jax import _library
    if _library.problem() is not None:
        pytest.skip(f"concord.jax's handlers: {_library.problem()}")
    weights = data(seed, 0, "w", (6, 4), "float64")
    for rank, seen in enumerate(process_ranks(RANKS, xlstm_gradients, seed)):
        for key, dtype, tolerance in (("float32", np.float32, 1e-6),
                                      ("float32 jit", np.float32, 1e-6),
                                      ("no casts", np.float64, 1e-12),
                                      ("backward in jit", np.float64, 1e-12),
                                      ("float16 scatter", np.float16, 1e-3),
                                      ("array float16 scatter", np.float16, 1e-3)):
            kind, value = seen[key]
            value = np.asarray(value)
            # Gradients come back in the block's dtype, whatever they were scattered in.
            assert kind == "float64" and value.shape == (2, 4), key
            expected = _block_mean(seed, rank, dtype).astype(np.float64)
            np.testing.assert_allclose(value, expected, rtol=tolerance, atol=tolerance,
                                       err_msg=key)
            # Reduced in `dtype`: every value is one of that dtype's.
            assert np.array_equal(value.astype(dtype).astype(np.float64), value), key
        kind, gathered = seen["gathered in jit"]
        assert kind == "float64" and np.array_equal(gathered, weights)
