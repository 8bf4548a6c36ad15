"""concord.data_parallel against NumPy references.

Multi-rank checks run in one concord.launch job per case and world size;
every rank builds every rank's data from (seed, rank, name), so the parent
computes the references itself from what the ranks return.
"""

import collections
import math
import warnings

import numpy as np
import optree
import pytest

import concord as cc
from concord import data_parallel as dp
from concord.data_parallel import ShardedArray

Point = collections.namedtuple("Point", "x y")


def data(seed, rank, name, shape, dtype="float32"):
    rng = np.random.default_rng([seed, rank, sum(map(ord, name))])
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.uniform(-2.0, 2.0, shape).astype(dtype)


def make_batch(seed, size):
    return {
        "image": data(seed, 0, "image", (size, 4, 2)),
        "label": np.arange(size, dtype=np.int64),
        "pair": (data(seed, 0, "pair", (size, 2), "float64"), [data(seed, 0, "l", (size,))]),
        "point": Point(data(seed, 0, "x", (size,), "float16"),
                       np.arange(size * 3).reshape(size, 3)),
        "none": None,
    }


def assert_trees_equal(actual, expected):
    assert optree.tree_structure(actual) == optree.tree_structure(expected)
    for a, e in zip(optree.tree_leaves(actual), optree.tree_leaves(expected)):
        assert type(a) is type(e)
        assert a.dtype == e.dtype and a.shape == e.shape
        assert np.array_equal(a, e)


# ---- batches --------------------------------------------------------------------

BATCH_SIZES = [0, 1, 5, 12, 13]
UNEVEN = ["error", "drop", "pad"]


def expected_rows(batch, shards, index, uneven):
    if batch % shards == 0 or uneven == "drop":
        per = batch // shards
        return np.arange(index * per, (index + 1) * per)
    if uneven == "error":
        return None
    per = -(-batch // shards)
    return np.arange(index * per, (index + 1) * per) % batch


def spec_batch(seed, size, spec):
    """The batch a spec can split: with a second entry, only leaves with a
    second dimension."""
    batch = make_batch(seed, size)
    if len(spec) > 1:
        return {"image": batch["image"], "pair": (batch["pair"][0],)}
    return batch


def _batch_job(seed, mesh_shape, names, spec):
    cc.init(timeout=60.0)
    mesh = cc.make_mesh(mesh_shape, names)
    sharding = cc.NamedSharding(mesh, cc.PartitionSpec(*spec))
    results = {}
    for size in BATCH_SIZES:
        for uneven in UNEVEN:
            try:
                results[size, uneven] = dp.place_batch_on_shards(spec_batch(seed, size, spec),
                                                                  sharding, uneven=uneven)
            except ValueError as exc:
                results[size, uneven] = str(exc)
    return mesh.coords, results


@pytest.mark.parametrize("mesh_shape, names, spec", [
    ((2,), ("data",), ("data",)),
    ((3,), ("data",), ("data",)),
    ((4,), ("data",), ("data",)),
    ((2, 2), ("data", "fsdp"), ("data",)),
    ((2, 2), ("data", "fsdp"), ("data", "fsdp")),
])
def test_shard_batch_matches_numpy_slicing(seed, mesh_shape, names, spec):
    results = cc.launch(_batch_job, math.prod(mesh_shape), seed, mesh_shape, names, spec)
    shards = mesh_shape[0]
    for coords, seen in results:
        index = coords["data"]
        for size in BATCH_SIZES:
            for uneven in UNEVEN:
                got = seen[size, uneven]
                rows = expected_rows(size, shards, index, uneven)
                if rows is None:
                    assert isinstance(got, str)
                    assert f"batch size {size} " in got and f"not divisible by {shards}," in got
                    continue
                expected = optree.tree_map(lambda x: np.take(x, rows, axis=0),
                                           spec_batch(seed, size, spec))
                if "fsdp" in spec:
                    f = coords["fsdp"]
                    expected["image"] = expected["image"][:, 2 * f:2 * f + 2]
                    expected["pair"] = (expected["pair"][0][:, f:f + 1],)
                assert_trees_equal(got, expected)


def test_shard_batch_on_one_rank_and_bad_input(world1):
    mesh = cc.make_mesh((1,), ("data",))
    sharding = dp.create_data_parallel_sharding(mesh)
    batch = make_batch(1, 7)
    for uneven in UNEVEN:
        assert_trees_equal(dp.shard_batch(batch, sharding, uneven=uneven), batch)
    with pytest.raises(ValueError, match="uneven must be one of"):
        dp.shard_batch(batch, sharding, uneven="wrap")
    with pytest.raises(ValueError, match="leaf step is 0-d"):
        dp.shard_batch({"step": np.float32(1)}, sharding)
    with pytest.raises(ValueError, match="unknown axis 'batch'"):
        dp.create_data_parallel_sharding(mesh, "batch")


# ---- shard_params / gather_params --------------------------------------------------

SMALL_SHAPES = [(8, 8), (16, 8, 16), (12, 6), (6, 12), (24,), (5, 7, 9), (4, 6, 4),
                (3, 1, 24), (13, 13), (2, 3), (), (0, 40)]
# Sizes at and around the default min_weight_size (2**18).
LARGE_SHAPES = [(512, 512), (4, 65535), (4, 65537), (262156,), (2, 131073)]
DTYPES = ["float32", "float64", "float16", "int32"]


def xlstm_dim(shape, shards, min_weight_size):
    """The xlstm-jax rule as written there: replicated at or below the size
    limit, else the first divisible dim in descending size order (stable
    argsort reversed: ties go to the later dim); "warn" when none."""
    if math.prod(shape) <= min_weight_size:
        return None
    for dim in np.argsort(shape, kind="stable")[::-1]:
        if shape[dim] % shards == 0:
            return int(dim)
    return "warn"


def make_params(seed, shapes):
    leaves = [data(seed, 0, f"p{i}", shape, DTYPES[i % len(DTYPES)])
              for i, shape in enumerate(shapes)]
    half = len(leaves) // 2
    return {"layers": [Point(*leaves[i:i + 2]) for i in range(0, half - half % 2, 2)],
            "rest": tuple(leaves[half - half % 2:]), "none": None}


def _shard_and_gather(params, axis, shards, min_weight_size, mesh):
    leaves = optree.tree_leaves(params)
    expect_warning = any(xlstm_dim(leaf.shape, shards, min_weight_size) == "warn"
                         for leaf in leaves)
    if expect_warning:
        with pytest.warns(UserWarning, match=rf"no dimension divisible by {shards} .* stay "
                                             "replicated"):
            sharded = dp.shard_params(params, axis, mesh=mesh, min_weight_size=min_weight_size)
    else:
        sharded = dp.shard_params(params, axis, mesh=mesh, min_weight_size=min_weight_size)
    gathered = dp.gather_params(sharded, axis, mesh=mesh)
    as_float32 = dp.gather_params(sharded, axis, mesh=mesh, gather_dtype=np.float32)
    return sharded, gathered, as_float32


def _params_job(seed, mesh_shape, names, axis):
    cc.init(timeout=60.0)
    mesh = cc.make_mesh(mesh_shape, names) if mesh_shape else None
    shards, index = (mesh.axis_size(axis), mesh.axis_index(axis)) if mesh else (cc.world_size(),
                                                                                cc.rank())
    return index, [
        _shard_and_gather(make_params(seed, SMALL_SHAPES), axis, shards, 16, mesh),
        _shard_and_gather(make_params(seed, LARGE_SHAPES), axis, shards, 2**18, mesh),
    ]


def check_sharded(sharded, params, shards, index, min_weight_size, axis):
    leaves = optree.tree_leaves(params)
    sharded_leaves = optree.tree_leaves(sharded)
    assert len(sharded_leaves) == len(leaves)
    for leaf, got in zip(leaves, sharded_leaves):
        dim = xlstm_dim(leaf.shape, shards, min_weight_size)
        if dim in (None, "warn"):
            assert not isinstance(got, ShardedArray)
            assert got.dtype == leaf.dtype and np.array_equal(got, leaf)
            continue
        assert isinstance(got, ShardedArray)
        assert (got.dim, got.global_shape, got.axis_name) == (dim, leaf.shape, axis)
        block = leaf.shape[dim] // shards
        assert np.array_equal(got.local, np.take(leaf, np.arange(index * block,
                                                                 (index + 1) * block), axis=dim))
        assert got.local.dtype == leaf.dtype


@pytest.mark.parametrize("nprocs, mesh_shape, names, axis", [
    (2, None, None, "fsdp"),
    (3, None, None, "fsdp"),
    (4, None, None, "data"),
    (4, (2, 2), ("data", "fsdp"), "fsdp"),
    (4, (2, 2), ("data", "fsdp"), ("data", "fsdp")),
])
def test_shard_params_rule_and_gather_round_trip(seed, nprocs, mesh_shape, names, axis):
    results = cc.launch(_params_job, nprocs, seed, mesh_shape, names, axis)
    shards = nprocs if mesh_shape is None else math.prod(
        mesh_shape[names.index(name)] for name in ((axis,) if isinstance(axis, str) else axis))
    for index, runs in results:
        for (sharded, gathered, as_float32), shapes, limit in zip(
                runs, [SMALL_SHAPES, LARGE_SHAPES], [16, 2**18]):
            params = make_params(seed, shapes)
            check_sharded(sharded, params, shards, index, limit, axis)
            assert_trees_equal(gathered, params)
            for leaf, got, full in zip(optree.tree_leaves(sharded), optree.tree_leaves(as_float32),
                                       optree.tree_leaves(params)):
                expected = full.astype(np.float32) if isinstance(leaf, ShardedArray) else full
                assert got.dtype == expected.dtype and np.array_equal(got, expected)


def test_shard_params_on_one_rank(world1):
    params = make_params(3, SMALL_SHAPES)
    sharded = dp.shard_params(params, "fsdp", min_weight_size=16)
    check_sharded(sharded, params, 1, 0, 16, "fsdp")
    assert_trees_equal(dp.gather_params(sharded, "fsdp"), params)
    # Leaves sharded over another axis pass through gather_params.
    assert optree.tree_leaves(dp.gather_params(sharded, "other"))[0] is \
        optree.tree_leaves(sharded)[0]
    # A 0-d leaf over the size limit has no dimension to split.
    with pytest.warns(UserWarning, match=r"no dimension divisible by 1 .*stay replicated: "
                                         r"scalar \(\)"):
        result = dp.shard_params({"scalar": np.float32(2)}, "fsdp", min_weight_size=0)
    assert result["scalar"] == np.float32(2)
    # ShardedArray maps over its local block in the "concord" namespace.
    doubled = optree.tree_map(lambda x: x * 2, sharded, namespace="concord")
    first = next(leaf for leaf in optree.tree_leaves(sharded) if isinstance(leaf, ShardedArray))
    first_doubled = next(leaf for leaf in optree.tree_leaves(doubled)
                         if isinstance(leaf, ShardedArray))
    assert first_doubled.dim == first.dim and np.array_equal(first_doubled.local, first.local * 2)
    with pytest.raises(ValueError, match="dim 2 is out of range"):
        ShardedArray(np.zeros(3), (3,), 2, "fsdp")


# ---- gather_array_with_mean_grads -------------------------------------------------

def _gather_grads_job(seed, mesh_shape, axis, x_dtype, gather_dtype, scatter_dtype):
    cc.init(timeout=60.0)
    mesh = cc.make_mesh(mesh_shape, ("data", "fsdp")) if mesh_shape else None
    shards = mesh.axis_size(axis) if mesh else cc.world_size()
    x = data(seed, cc.rank(), "x", (3, 2, 5), x_dtype)
    full, backward = dp.gather_array_with_mean_grads(x, 1, axis, mesh=mesh,
                                                     gather_dtype=gather_dtype,
                                                     grad_scatter_dtype=scatter_dtype)
    grad = data(seed, cc.rank(), "g", (3, 2 * shards, 5), x_dtype)
    return full, backward(grad)


@pytest.mark.parametrize("nprocs, mesh_shape, axis", [
    (2, None, "data"), (3, None, "data"), (4, None, "batch"), (4, (2, 2), "fsdp"),
    (4, (2, 2), "data")])
@pytest.mark.parametrize("x_dtype, gather_dtype, scatter_dtype", [
    ("float32", None, None), ("float64", "float32", "float32")])
def test_gather_array_with_mean_grads(seed, nprocs, mesh_shape, axis, x_dtype, gather_dtype,
                                      scatter_dtype):
    results = cc.launch(_gather_grads_job, nprocs, seed, mesh_shape, axis, x_dtype,
                        gather_dtype, scatter_dtype)
    for rank, (full, grad_block) in enumerate(results):
        if mesh_shape is None:
            group = list(range(nprocs))
        else:
            d, f = divmod(rank, 2)
            group = [2 * d, 2 * d + 1] if axis == "fsdp" else [f, 2 + f]
        index = group.index(rank)
        xs = [data(seed, r, "x", (3, 2, 5), x_dtype) for r in group]
        expected_full = np.concatenate(xs, axis=1).astype(gather_dtype or x_dtype)
        assert full.dtype == expected_full.dtype and np.array_equal(full, expected_full)
        grads = [data(seed, r, "g", (3, 2 * len(group), 5), x_dtype) for r in group]
        expected = np.mean([g[:, 2 * index:2 * index + 2].astype(np.float64) for g in grads],
                           axis=0)
        assert grad_block.dtype == np.dtype(x_dtype) and grad_block.shape == (3, 2, 5)
        np.testing.assert_allclose(grad_block, expected, rtol=1e-6, atol=1e-6)


# ---- sync_gradients / reduce_gradients_across_devices -------------------------------

def make_grads(seed, rank):
    return {
        "w": data(seed, rank, "w", (3, 4)),
        "b": data(seed, rank, "b", (5,), "float64"),
        "list": [data(seed, rank, "h", (2, 2), "float16")],
        "fsdp": ShardedArray(data(seed, rank, "fs", (2, 3)), (4, 3), 0, "fsdp"),
        "data": ShardedArray(data(seed, rank, "ds", (3,), "float64"), (6,), 0, "data"),
        "both": ShardedArray(data(seed, rank, "bo", (1, 2)), (4, 2), 0, ("data", "fsdp")),
    }


SYNC_CALLS = [("data", "fsdp"), "data", "fsdp", ("fsdp", "data")]


def _sync_job(seed):
    cc.init(timeout=60.0)
    mesh = cc.make_mesh((2, 2), ("data", "fsdp"))
    grads = make_grads(seed, cc.rank())
    results = [dp.sync_gradients(grads, names, mesh=mesh) for names in SYNC_CALLS]
    with cc.use_mesh(mesh):
        results.append(dp.sync_gradients(grads, ("data", "fsdp")))
        try:
            dp.sync_gradients(grads, ("data", "model"))
        except ValueError as exc:
            results.append(str(exc))
    return results


def mean_over(seed, ranks, path_leaf):
    values = [path_leaf(make_grads(seed, r)) for r in ranks]
    values = [v.local if isinstance(v, ShardedArray) else v for v in values]
    dtype = values[0].dtype
    return np.mean([v.astype(np.float64) for v in values], axis=0).astype(dtype)


def check_synced(seed, rank, synced, names):
    names = (names,) if isinstance(names, str) else names
    d, f = divmod(rank, 2)
    coords = {"data": d, "fsdp": f}

    def group(axes):
        fixed = {axis: coords[axis] for axis in coords if axis not in axes}
        return [r for r in range(4) if all(divmod(r, 2)[("data", "fsdp").index(a)] == c
                                           for a, c in fixed.items())]

    own = make_grads(seed, rank)
    for key, get in [("w", lambda g: g["w"]), ("b", lambda g: g["b"]),
                     ("list", lambda g: g["list"][0]), ("fsdp", lambda g: g["fsdp"]),
                     ("data", lambda g: g["data"]), ("both", lambda g: g["both"])]:
        leaf = get(own)
        sharded_on = (set((leaf.axis_name,) if isinstance(leaf.axis_name, str)
                          else leaf.axis_name) if isinstance(leaf, ShardedArray) else set())
        axes = [n for n in names if n not in sharded_on]
        got = get(synced)
        if isinstance(leaf, ShardedArray):
            assert isinstance(got, ShardedArray)
            assert (got.global_shape, got.dim, got.axis_name) == \
                (leaf.global_shape, leaf.dim, leaf.axis_name)
            got = got.local
        expected = mean_over(seed, group(axes), get) if axes else (
            leaf.local if isinstance(leaf, ShardedArray) else leaf)
        assert got.dtype == expected.dtype, key
        tolerance = 2e-3 if got.dtype == np.float16 else 1e-6
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance, err_msg=key)


def test_sync_gradients_on_a_2x2_mesh(seed):
    results = cc.launch(_sync_job, 4, seed)
    for rank, seen in enumerate(results):
        for synced, names in zip(seen, SYNC_CALLS + [("data", "fsdp")]):
            check_synced(seed, rank, synced, names)
        assert seen[-1] == "unknown axis 'model'; mesh axes are ('data', 'fsdp')"


def _reduce_job(seed):
    cc.init(timeout=60.0)
    grads = {k: v for k, v in make_grads(seed, cc.rank()).items() if k in ("w", "b", "list")}
    grads["int"] = data(seed, cc.rank(), "i", (4,), "int32")
    results = {
        "SUM": dp.reduce_gradients_across_devices(grads, "SUM"),
        "Mean": dp.all_reduce_gradients(grads, "Mean", axis_name="batch"),
    }
    try:
        dp.reduce_gradients_across_devices(grads, "median")
    except ValueError as exc:
        results["median"] = str(exc)
    return results


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_reduce_gradients_across_devices(seed, nprocs):
    results = cc.launch(_reduce_job, nprocs, seed)
    for seen in results:
        for key in ("w", "b", "int"):
            stack = np.stack([(make_grads(seed, r).get(key) if key != "int"
                               else data(seed, r, "i", (4,), "int32")) for r in range(nprocs)])
            total = stack.sum(axis=0)
            mean = np.trunc(total / nprocs) if key == "int" else stack.astype(np.float64).mean(0)
            np.testing.assert_allclose(seen["SUM"][key], total, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(seen["Mean"][key], mean.astype(stack.dtype), rtol=1e-6,
                                       atol=1e-6)
            assert seen["Mean"][key].dtype == stack.dtype
        halves = np.stack([make_grads(seed, r)["list"][0] for r in range(nprocs)])
        np.testing.assert_allclose(seen["SUM"]["list"][0],
                                   halves.astype(np.float32).sum(0).astype(np.float16), rtol=2e-3)
        assert seen["median"] == "reduce_type must be 'mean' or 'sum', got 'median'"


def test_reductions_on_one_rank_and_bad_input(world1):
    grads = make_grads(5, 0)
    assert_trees_equal(dp.sync_gradients({"w": grads["w"]}, "data"), {"w": grads["w"]})
    with pytest.raises(ValueError, match="reduce_type must be 'mean' or 'sum', got 'median'"):
        dp.reduce_gradients_across_devices(grads, "median")
    with pytest.raises(ValueError, match="reduce_type"):
        dp.reduce_gradients_across_devices(grads, None)
    mesh = cc.make_mesh((1, 1), ("data", "fsdp"))
    unknown = r"unknown axis 'batch'; mesh axes are \('data', 'fsdp'\)"
    with cc.use_mesh(mesh):
        for call in [lambda: dp.sync_gradients(grads, "batch"),
                     lambda: dp.sync_gradients(grads, ("data", "batch")),
                     lambda: dp.reduce_gradients_across_devices(grads, axis_name="batch"),
                     lambda: dp.shard_params(grads, "batch"),
                     lambda: dp.gather_params(grads, "batch"),
                     lambda: dp.gather_array_with_mean_grads(grads["w"], 0, "batch")]:
            with pytest.raises(ValueError, match=unknown):
                call()
        # Sum over the whole mesh of one rank is the identity.
        reduced = dp.reduce_gradients_across_devices(grads, "sum")
    assert np.array_equal(reduced["fsdp"].local, grads["fsdp"].local)


# ---- mismatched pytrees ------------------------------------------------------------

def _mismatch_job():
    cc.init(timeout=60.0)
    rank = cc.rank()
    tree = {"a": np.ones(4, np.float32), "b": np.ones(3, np.float32)}
    if rank == 1:
        tree = {"a": np.ones(4, np.float32), "c": np.ones(3, np.float32)}
    shaped = {"a": np.ones(4 if rank != 2 else 5, np.float32)}
    sharded = {"p": ShardedArray(np.ones((2, 2)), (2 * cc.world_size(), 2), 0, "fsdp")}
    if rank == 0:
        sharded["q"] = np.ones(2)
    calls = {
        "sync": lambda: dp.sync_gradients(tree, "data"),
        "reduce": lambda: dp.reduce_gradients_across_devices(tree, "sum"),
        "shapes": lambda: dp.all_reduce_gradients(shaped),
        "replicate": lambda: dp.replicate_params(tree, cc.world()),
        "gather": lambda: dp.gather_params(sharded, "fsdp"),
    }
    results = {}
    for name, call in calls.items():
        try:
            call()
            results[name] = None
        except cc.MismatchError as exc:
            results[name] = str(exc)
    # The communicator is still fine afterwards.
    results["after"] = float(cc.all_reduce(np.ones(1))[0])
    return results


def test_mismatched_pytrees_raise_mismatch_error():
    results = cc.launch(_mismatch_job, 3)
    for rank, seen in enumerate(results):
        assert seen["after"] == 3.0
        assert "ranks [0, 2]; ranks [1]" in seen["sync"]
        assert "ranks [0, 2]; ranks [1]" in seen["reduce"]
        assert "ranks [0, 2]; ranks [1]" in seen["replicate"]
        assert "ranks [0, 1]; ranks [2]" in seen["shapes"]
        assert "ranks [0]; ranks [1, 2]" in seen["gather"]
        assert f"This rank ({rank}) passed" in seen["sync"]


# ---- replicating and placing model state --------------------------------------------

def _state(seed, rank):
    return {"enc": {"w": data(seed, rank, "ew", (3, 6)),
                    "b": data(seed, rank, "eb", (6,), "float64")},
            "dec": [data(seed, rank, "dw", (6, 2)), data(seed, rank, "db", (3,), "int32")],
            "step": np.int64(rank)}


def _state_job(seed):
    cc.init(timeout=60.0)
    mesh = cc.make_mesh((3,), ("data",))
    state = _state(seed, cc.rank())
    results = {
        "replicate": dp.place_model_state_on_shards(state, mesh),
        "root2": dp.replicate_params(state, cc.world(), root=2),
        "none is same": dp.shard_model_state(state, mesh, None) is state,
        "shard": dp.shard_model_state(state, mesh, "shard"),
        "paths": dp.place_model_state_on_shards(
            state, mesh, {"enc/w": cc.PartitionSpec(None, "data"), ("dec",): ("data",)}),
    }
    for name, bad in [("unknown path", {"enc/v": cc.PartitionSpec("data")}),
                      ("mode", "scatter"),
                      ("indivisible", {"dec/0": cc.PartitionSpec(None, "data")}),
                      ("root", 3)]:
        try:
            if name == "root":
                dp.replicate_params(state, mesh, root=bad)
            else:
                dp.place_model_state_on_shards(state, mesh, bad)
        except ValueError as exc:
            results[name] = str(exc)
    return results


def test_replicate_and_place_model_state(seed):
    results = cc.launch(_state_job, 3, seed)
    zero, two = _state(seed, 0), _state(seed, 2)
    for rank, seen in enumerate(results):
        own = _state(seed, rank)
        assert_trees_equal(seen["replicate"], optree.tree_map(np.asarray, zero))
        assert_trees_equal(seen["root2"], optree.tree_map(np.asarray, two))
        assert seen["none is same"]
        rows = slice(2 * rank, 2 * rank + 2)
        own_db = own["dec"][1][rank:rank + 1]
        assert_trees_equal(seen["shard"], {"enc": {"w": own["enc"]["w"][rank:rank + 1],
                                                   "b": own["enc"]["b"][rows]},
                                           "dec": [own["dec"][0][rows], own_db],
                                           "step": own["step"]})
        assert_trees_equal(seen["paths"], {"enc": {"w": own["enc"]["w"][:, rows],
                                                   "b": own["enc"]["b"]},
                                           "dec": [own["dec"][0][rows], own_db],
                                           "step": own["step"]})
        assert "no leaf has the path 'enc/v'" in seen["unknown path"]
        assert "param_sharding must be" in seen["mode"]
        assert "not divisible by 3" in seen["indivisible"]
        assert "broadcast: root 3 is outside [0, 3)" in seen["root"]


# ---- the DataParallel class ------------------------------------------------------

def _class_job(seed):
    cc.init(timeout=60.0)
    parallel = dp.DataParallel()
    batch = make_batch(seed, 6)
    params = {"w": data(seed, 0, "w", (8, 4)), "b": data(seed, cc.rank(), "b", (3,))}
    grads = {"w": data(seed, cc.rank(), "gw", (8, 4))}
    mesh = parallel.mesh
    sharded = parallel.shard_params(params, min_weight_size=4)
    static_sharding = dp.DataParallel.create_sharding_static(mesh)
    return {
        "axes": mesh.axis_names,
        "batch": parallel.shard_batch(batch),
        "batch static": dp.DataParallel.shard_batch_static(batch, static_sharding),
        "replicated": parallel.replicate_params(params),
        "round trip": parallel.gather_params(sharded),
        "round trip static": dp.DataParallel.gather_params_static(sharded, "data", mesh=mesh),
        "synced": parallel.sync_gradients(grads),
        "synced static": dp.DataParallel.sync_gradients_static(grads, "data", mesh=mesh),
        "summed": parallel.reduce_gradients(grads, "sum"),
        "summed static": dp.DataParallel.all_reduce_gradients_static(grads, "sum"),
        "state": parallel.shard_model_state(params),
        "hybrid": dp.DataParallel().create_mesh({"data": 1, "model": 2}).shape,
    }


def test_data_parallel_class_on_two_ranks(seed):
    results = cc.launch(_class_job, 2, seed)
    params0 = {"w": data(seed, 0, "w", (8, 4)), "b": data(seed, 0, "b", (3,))}
    grads = [data(seed, r, "gw", (8, 4)) for r in range(2)]
    for rank, seen in enumerate(results):
        assert seen["axes"] == ("data",)
        expected = optree.tree_map(lambda x: x[3 * rank:3 * rank + 3], make_batch(seed, 6))
        assert_trees_equal(seen["batch"], expected)
        assert_trees_equal(seen["batch static"], expected)
        assert_trees_equal(seen["replicated"], params0)
        assert_trees_equal(seen["state"], params0)
        own = {"w": params0["w"], "b": data(seed, rank, "b", (3,))}
        assert_trees_equal(seen["round trip"], own)
        assert_trees_equal(seen["round trip static"], own)
        mean = ((grads[0].astype(np.float64) + grads[1]) / 2).astype(np.float32)
        for key, expected in [("synced", mean), ("synced static", mean),
                              ("summed", grads[0] + grads[1]),
                              ("summed static", grads[0] + grads[1])]:
            np.testing.assert_allclose(seen[key]["w"], expected, rtol=1e-6, atol=1e-6)
        assert seen["hybrid"] == {"data": 1, "model": 2}


# ---- other array types --------------------------------------------------------------

def test_leaves_keep_their_array_type(world1):
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own import-time notices
        batch = {"x": torch.arange(12, dtype=torch.float32).reshape(6, 2),
                 "y": torch.arange(6)}
    mesh = cc.make_mesh((1,), ("data",))
    sharding = dp.create_data_parallel_sharding(mesh)
    placed = dp.shard_batch(batch, sharding, uneven="pad")
    assert isinstance(placed["x"], torch.Tensor) and torch.equal(placed["x"], batch["x"])
    replicated = dp.replicate_params(batch, mesh)
    assert isinstance(replicated["y"], torch.Tensor) and torch.equal(replicated["y"], batch["y"])
    synced = dp.sync_gradients({"g": batch["x"]}, "data", mesh=mesh)
    assert isinstance(synced["g"], torch.Tensor) and torch.equal(synced["g"], batch["x"])
    sharded = dp.shard_params({"w": batch["x"]}, "data", mesh=mesh, min_weight_size=1)
    assert isinstance(sharded["w"].local, torch.Tensor)
    gathered = dp.gather_params(sharded, "data", mesh=mesh, gather_dtype=torch.float64)
    assert gathered["w"].dtype == torch.float64 and torch.equal(gathered["w"],
                                                                 batch["x"].double())
